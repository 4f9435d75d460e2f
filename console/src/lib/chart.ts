// Which columns of a result the chart shows, and the series it draws from the rows.

/** `types` of a run answer: `[column, type]` pairs. */
export type ColumnTypes = [string, string][];
export type ColumnKind = 'time' | 'number' | 'category';

export function columnKind(type: string): ColumnKind {
  switch (type) {
    case 'date':
    case 'datetime':
      return 'time';
    case 'integer':
    case 'float':
    case 'decimal':
      return 'number';
    default:
      return 'category';
  }
}

export interface ChartChoice {
  /** A line over a date or time column, bars over anything else. */
  kind: 'line' | 'bar';
  x: string;
  y: string[];
}

/** The chart for a column choice: the kind follows the x column. */
export function chartFor(types: ColumnTypes, x: string, y: string[]): ChartChoice {
  const xType = types.find(([name]) => name === x)?.[1] ?? 'string';
  return { kind: columnKind(xType) === 'time' ? 'line' : 'bar', x, y: y.filter((name) => name !== x) };
}

/** The first chart to show: x is the first date/time column, else the first text one, else the first column;
 * y is every numeric column but x. None when no column can be plotted. */
export function defaultChart(types: ColumnTypes): ChartChoice | null {
  const kinds = types.map(([name, type]) => [name, columnKind(type)] as const);
  const x =
    kinds.find(([, kind]) => kind === 'time')?.[0] ??
    kinds.find(([, kind]) => kind === 'category')?.[0] ??
    kinds[0]?.[0];
  if (x === undefined) return null;
  const y = kinds.filter(([name, kind]) => kind === 'number' && name !== x).map(([name]) => name);
  return y.length === 0 ? null : chartFor(types, x, y);
}

/** The columns a user may put on the y axis: the numeric ones. */
export function plottable(types: ColumnTypes): string[] {
  return types.filter(([, type]) => columnKind(type) === 'number').map(([name]) => name);
}

export interface Series {
  labels: string[];
  datasets: { label: string; data: (number | null)[] }[];
}

/** The chart's data from the rows; a line is drawn in time order whatever the rows' order. */
export function series(rows: Record<string, unknown>[], choice: ChartChoice): Series {
  const ordered =
    choice.kind === 'line'
      ? [...rows].sort((a, b) => String(a[choice.x] ?? '').localeCompare(String(b[choice.x] ?? '')))
      : rows;
  return {
    labels: ordered.map((row) => (row[choice.x] === null || row[choice.x] === undefined ? '(null)' : String(row[choice.x]))),
    datasets: choice.y.map((column) => ({
      label: column,
      data: ordered.map((row) => {
        const value = row[column];
        const number = typeof value === 'number' ? value : typeof value === 'string' ? Number(value) : NaN;
        return Number.isFinite(number) ? number : null;
      }),
    })),
  };
}
