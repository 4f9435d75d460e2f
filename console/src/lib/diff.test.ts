import { describe, expect, it } from 'vitest';
import { breakingText, columnChanges, sideBySide } from './diff';

describe('the version diff', () => {
  it('puts changed lines face to face and keeps the rest aligned', () => {
    const before = 'SELECT country,\n  count(*) AS events\nFROM events\nGROUP BY country';
    const after = 'SELECT country,\n  count(*) AS n\nFROM events\nWHERE day >= {variables.since}\nGROUP BY country';
    expect(sideBySide(before, after)).toEqual([
      { kind: 'same', left: 'SELECT country,', right: 'SELECT country,' },
      { kind: 'changed', left: '  count(*) AS events', right: '  count(*) AS n' },
      { kind: 'same', left: 'FROM events', right: 'FROM events' },
      { kind: 'added', left: null, right: 'WHERE day >= {variables.since}' },
      { kind: 'same', left: 'GROUP BY country', right: 'GROUP BY country' },
    ]);
  });

  it('shows lines only one side has', () => {
    expect(sideBySide('a\nb\nc', 'a')).toEqual([
      { kind: 'same', left: 'a', right: 'a' },
      { kind: 'removed', left: 'b', right: null },
      { kind: 'removed', left: 'c', right: null },
    ]);
  });

  it('names added, removed and retyped columns', () => {
    const before = [
      { name: 'country', type: 'string' as const },
      { name: 'events', type: 'integer' as const },
      { name: 'revenue', type: 'float' as const },
    ];
    const after = [
      { name: 'country', type: 'string' as const },
      { name: 'events', type: 'float' as const },
      { name: 'day', type: 'date' as const },
    ];
    expect(columnChanges(before, after)).toEqual([
      { name: 'country', kind: 'same', before: 'string', after: 'string' },
      { name: 'events', kind: 'retyped', before: 'integer', after: 'float' },
      { name: 'day', kind: 'added', before: null, after: 'date' },
      { name: 'revenue', kind: 'removed', before: 'float', after: null },
    ]);
    expect(columnChanges(null, null)).toEqual([]);
  });

  it('says what a breaking version breaks', () => {
    expect(
      breakingText([
        { column: 'revenue', change: 'removed', from: 'float', to: null },
        { column: 'events', change: 'type_changed', from: 'integer', to: 'string' },
      ]),
    ).toBe('Breaks callers of the version before: revenue (float) removed; events changed from integer to string.');
  });
});
