import { describe, expect, it } from 'vitest';
import { bytes, cell, exact, ms, relative } from './format';

describe('formatting', () => {
  const now = Date.parse('2026-03-01T12:00:00Z');
  it('says how long ago or until', () => {
    expect(relative(null, now)).toBe('never');
    expect(relative('2026-03-01T11:57:00Z', now)).toBe('3 minutes ago');
    expect(relative('2026-03-01T14:00:00Z', now)).toBe('in 2 hours');
    expect(relative('2026-03-01T12:00:02Z', now)).toBe('just now');
  });
  it('reads sizes, durations and cells', () => {
    expect(bytes(512)).toBe('512 B');
    expect(bytes(9558873)).toBe('9.1 MB');
    expect(bytes(null)).toBe('—');
    expect(ms(1.234)).toBe('1.23 ms');
    expect(ms(386.6)).toBe('387 ms');
    expect(ms(2500)).toBe('2.50 s');
    expect(cell(null)).toBe('null');
    expect(cell(['a', 1])).toBe('["a",1]');
    expect(exact('2026-03-01T12:00:00.123Z')).toBe('2026-03-01 12:00:00 UTC');
  });
});
