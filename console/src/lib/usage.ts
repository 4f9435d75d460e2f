// What the Usage tab draws from an endpoint's usage buckets, and how the Logs tab shows a record.

import type { LogEntry, UsageBucket } from './api';

export interface UsageSeries {
  labels: string[];
  requests: number[];
  errors: number[];
  p50: (number | null)[];
  p95: (number | null)[];
  p99: (number | null)[];
}

/** A bucket's start as its axis label: the time of day for minutes and hours, the date for days. */
export function bucketLabel(start: string, interval: string): string {
  const iso = new Date(start).toISOString();
  return interval === 'day' ? iso.slice(0, 10) : iso.slice(11, 16);
}

/** The chart's series: requests and errors as bars, the percentiles as lines (gaps where a bucket had no run). */
export function usageSeries(buckets: UsageBucket[], interval: string): UsageSeries {
  return {
    labels: buckets.map((b) => bucketLabel(b.start, interval)),
    requests: buckets.map((b) => b.requests - b.errors),
    errors: buckets.map((b) => b.errors),
    p50: buckets.map((b) => b.p50_ms),
    p95: buckets.map((b) => b.p95_ms),
    p99: buckets.map((b) => b.p99_ms),
  };
}

export interface UsageTotals {
  requests: number;
  errors: number;
  errorRate: number;
  cacheHitRate: number;
  rows: number;
  bytesRead: number;
  /** The slowest bucket's p95, in milliseconds; null without runs. */
  worstP95: number | null;
}

export function totals(buckets: UsageBucket[]): UsageTotals {
  const sum = (f: (b: UsageBucket) => number) => buckets.reduce((n, b) => n + f(b), 0);
  const requests = sum((b) => b.requests);
  const errors = sum((b) => b.errors);
  const p95s = buckets.map((b) => b.p95_ms).filter((p): p is number => p !== null);
  return {
    requests,
    errors,
    errorRate: requests === 0 ? 0 : errors / requests,
    cacheHitRate: requests === 0 ? 0 : sum((b) => b.cache_hits) / requests,
    rows: sum((b) => b.rows),
    bytesRead: sum((b) => b.bytes_read),
    worstP95: p95s.length === 0 ? null : Math.max(...p95s),
  };
}

/** A record's outcome as one short text: the status, and the error code of a failure. */
export function outcome(entry: LogEntry): string {
  return entry.code ? `${entry.status} ${entry.code}` : String(entry.status);
}

export function isError(entry: LogEntry): boolean {
  return entry.status >= 400;
}
