import { describe, expect, it } from 'vitest';
import type { LogEntry, UsageBucket } from './api';
import { bucketLabel, isError, outcome, totals, usageSeries } from './usage';

function bucket(start: string, requests: number, errors: number, p95: number | null): UsageBucket {
  return {
    start,
    requests,
    errors,
    cache_hits: requests - errors,
    p50_ms: p95 === null ? null : p95 / 2,
    p95_ms: p95,
    p99_ms: p95 === null ? null : p95 * 2,
    rows: requests * 3,
    bytes_read: 100,
  };
}

describe('usage', () => {
  const buckets = [bucket('2026-11-26T10:00:00Z', 10, 2, 8), bucket('2026-11-26T10:01:00Z', 0, 0, null)];

  it('draws successes and errors as bars and the percentiles with gaps', () => {
    const series = usageSeries(buckets, 'minute');
    expect(series.labels).toEqual(['10:00', '10:01']);
    expect(series.requests).toEqual([8, 0]);
    expect(series.errors).toEqual([2, 0]);
    expect(series.p95).toEqual([8, null]);
    expect(series.p99).toEqual([16, null]);
    expect(bucketLabel('2026-11-26T00:00:00Z', 'day')).toBe('2026-11-26');
  });

  it('sums the range', () => {
    expect(totals(buckets)).toEqual({
      requests: 10,
      errors: 2,
      errorRate: 0.2,
      cacheHitRate: 0.8,
      rows: 30,
      bytesRead: 200,
      worstP95: 8,
    });
    expect(totals([]).worstP95).toBeNull();
    expect(totals([]).errorRate).toBe(0);
  });

  it('says how a run ended', () => {
    const entry = { status: 429, code: 'rate_limited' } as LogEntry;
    expect(outcome(entry)).toBe('429 rate_limited');
    expect(isError(entry)).toBe(true);
    expect(outcome({ status: 200, code: null } as LogEntry)).toBe('200');
    expect(isError({ status: 304, code: null } as LogEntry)).toBe(false);
  });
});
