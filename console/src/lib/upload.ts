// The media type of a file the user uploads into a table, from its name.

export const UPLOAD_TYPES: Record<string, string> = {
  csv: 'text/csv',
  ndjson: 'application/x-ndjson',
  jsonl: 'application/x-ndjson',
  parquet: 'application/vnd.apache.parquet',
};

export function uploadType(fileName: string): string | null {
  const extension = fileName.toLowerCase().split('.').pop() ?? '';
  return UPLOAD_TYPES[extension] ?? null;
}

/** A table name from a file name: `Orders EU.csv` → `Orders_EU`. */
export function tableNameOf(fileName: string): string {
  const stem = fileName.replace(/\.[^.]*$/, '').replace(/[^A-Za-z0-9_]+/g, '_').replace(/^[^A-Za-z]+/, '');
  return stem.slice(0, 63);
}
