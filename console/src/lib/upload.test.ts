import { describe, expect, it } from 'vitest';
import { tableNameOf, uploadType } from './upload';

describe('uploads', () => {
  it('sends each file with its media type', () => {
    expect(uploadType('events.CSV')).toBe('text/csv');
    expect(uploadType('a.b.parquet')).toBe('application/vnd.apache.parquet');
    expect(uploadType('rows.jsonl')).toBe('application/x-ndjson');
    expect(uploadType('notes.txt')).toBeNull();
  });
  it('suggests a valid table name', () => {
    expect(tableNameOf('Orders EU.csv')).toBe('Orders_EU');
    expect(tableNameOf('2026-sales.parquet')).toBe('sales');
  });
});
