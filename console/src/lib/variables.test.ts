import { describe, expect, it } from 'vitest';
import type { Variable } from './api';
import {
  declarations,
  draftOf,
  formatValue,
  inputKind,
  listItems,
  newDraft,
  parseValue,
  runVariables,
  usedVariables,
} from './variables';

const variable = (type: Variable['type'], extra: Partial<Variable> = {}): Variable => ({
  type,
  default: null,
  required: true,
  description: null,
  ...extra,
});

describe('the run form', () => {
  it('shows the input a type needs', () => {
    expect(inputKind('Date')).toBe('date');
    expect(inputKind('DateTime')).toBe('datetime-local');
    expect(inputKind('List')).toBe('list');
    expect(inputKind('Boolean')).toBe('checkbox');
    expect(inputKind('Integer')).toBe('number');
    expect(inputKind('String')).toBe('text');
  });

  it('parses each type into the JSON the service expects', () => {
    expect(parseValue('Number', '2.5')).toEqual({ value: 2.5 });
    expect(parseValue('Number', 'abc')).toEqual({ error: 'Enter a number.' });
    expect(parseValue('Integer', '42')).toEqual({ value: 42 });
    expect(parseValue('Integer', '4.2')).toEqual({ error: 'Enter a whole number.' });
    expect(parseValue('Date', '2026-03-01')).toEqual({ value: '2026-03-01' });
    expect(parseValue('Date', '03/01/2026')).toHaveProperty('error');
    expect(parseValue('DateTime', '2026-03-01T10:30')).toEqual({ value: '2026-03-01T10:30:00Z' });
    expect(parseValue('DateTime', '2026-03-01T10:30:15')).toEqual({ value: '2026-03-01T10:30:15Z' });
    expect(parseValue('DateTime', '2026-03-01T10:30:00+01:00')).toEqual({ value: '2026-03-01T10:30:00+01:00' });
    expect(parseValue('Boolean', true)).toEqual({ value: true });
    expect(parseValue('Boolean', 'false')).toEqual({ value: false });
    expect(parseValue('List', 'US, GB\nFR,')).toEqual({ value: ['US', 'GB', 'FR'] });
    expect(parseValue('String', '  ')).toEqual({ omitted: true });
    expect(parseValue('String', ' a b ')).toEqual({ value: 'a b' });
  });

  it('keeps numbers in lists as numbers', () => {
    expect(listItems('1, 2.5, -3, x1')).toEqual([1, 2.5, -3, 'x1']);
  });

  it('shows declared defaults in the fields', () => {
    expect(formatValue('List', ['a', 'b'])).toBe('a, b');
    expect(formatValue('Boolean', null)).toBe(false);
    expect(formatValue('DateTime', '2026-03-01T10:30:00+01:00')).toBe('2026-03-01T09:30:00');
    expect(formatValue('Number', 0)).toBe('0');
  });

  it('omits empty optional fields so the defaults apply, and requires the rest', () => {
    const declared = {
      since: variable('Date'),
      country: variable('String', { default: 'US', required: false }),
      top: variable('Integer', { default: 10, required: false }),
    };
    expect(runVariables(declared, { since: '2026-01-01', country: '' })).toEqual({
      variables: { since: '2026-01-01', top: 10 },
      errors: {},
    });
    expect(runVariables(declared, { since: '', top: 'x' })).toEqual({
      variables: { country: 'US' },
      errors: { since: 'Required.', top: 'Enter a whole number.' },
    });
  });
});

describe('declarations', () => {
  it('finds the variables a query uses, once each', () => {
    expect(usedVariables('SELECT * FROM t WHERE a = {variables.a} AND b > { variables.b_2 } OR a = {variables.a}')).toEqual([
      'a',
      'b_2',
    ]);
  });

  it('round-trips a declaration through the form', () => {
    const declared = variable('List', { default: ['Chrome', 'Safari'], required: false, description: 'browsers' });
    const draft = draftOf('browsers', declared);
    expect(draft).toEqual({ name: 'browsers', type: 'List', default: 'Chrome, Safari', required: false, description: 'browsers' });
    expect(declarations([draft]).variables).toEqual({
      browsers: { type: 'List', default: ['Chrome', 'Safari'], required: false, description: 'browsers' },
    });
  });

  it('leaves out the default when there is none and reports a bad one', () => {
    const since = { ...newDraft('since'), type: 'Date' as const };
    const top = { ...newDraft('top'), type: 'Integer' as const, default: 'ten', required: false };
    expect(declarations([since, top, newDraft('  ')])).toEqual({
      variables: { since: { type: 'Date', required: true, description: null } },
      errors: { top: 'Default: Enter a whole number.' },
    });
  });
});
