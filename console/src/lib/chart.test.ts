import { describe, expect, it } from 'vitest';
import { chartFor, defaultChart, plottable, series, type ColumnTypes } from './chart';

describe('the chart', () => {
  it('draws a line over the first date or time column', () => {
    const types: ColumnTypes = [['country', 'string'], ['day', 'date'], ['events', 'integer'], ['revenue', 'float']];
    expect(defaultChart(types)).toEqual({ kind: 'line', x: 'day', y: ['events', 'revenue'] });
  });

  it('draws bars over a text column when there is no time column', () => {
    const types: ColumnTypes = [['browser', 'string'], ['events', 'integer']];
    expect(defaultChart(types)).toEqual({ kind: 'bar', x: 'browser', y: ['events'] });
  });

  it('uses the first column as x when every column is a number', () => {
    expect(defaultChart([['hour', 'integer'], ['n', 'integer']])).toEqual({ kind: 'bar', x: 'hour', y: ['n'] });
  });

  it('shows no chart without a numeric column to plot', () => {
    expect(defaultChart([['name', 'string'], ['at', 'datetime']])).toBeNull();
    expect(defaultChart([])).toBeNull();
  });

  it('follows the columns the user picks', () => {
    const types: ColumnTypes = [['day', 'datetime'], ['country', 'string'], ['events', 'integer']];
    expect(chartFor(types, 'country', ['events', 'country'])).toEqual({ kind: 'bar', x: 'country', y: ['events'] });
    expect(chartFor(types, 'day', ['events'])).toEqual({ kind: 'line', x: 'day', y: ['events'] });
    expect(plottable(types)).toEqual(['events']);
  });

  it('orders a line by time and keeps bars in the rows’ order', () => {
    const rows = [
      { day: '2026-03-02', n: 2 },
      { day: '2026-03-01', n: 1 },
      { day: null, n: 'x' },
    ];
    expect(series(rows, { kind: 'line', x: 'day', y: ['n'] })).toEqual({
      labels: ['(null)', '2026-03-01', '2026-03-02'],
      datasets: [{ label: 'n', data: [null, 1, 2] }],
    });
    expect(series(rows, { kind: 'bar', x: 'day', y: ['n'] }).labels).toEqual(['2026-03-02', '2026-03-01', '(null)']);
  });
});
