import { describe, expect, it } from 'vitest';
import { fieldOf } from './fields';

describe("the server's attr", () => {
  it('points at the field of the form that shows it', () => {
    expect(fieldOf('query')).toEqual({ field: 'query' });
    expect(fieldOf('query.kind')).toEqual({ field: 'query' });
    expect(fieldOf('query.variables.since.default')).toEqual({ field: 'variable', name: 'since' });
    expect(fieldOf('variables.country')).toEqual({ field: 'variable', name: 'country' });
    expect(fieldOf('name')).toEqual({ field: 'name' });
    expect(fieldOf('is_materialized')).toEqual({ field: 'form' });
    expect(fieldOf(null)).toEqual({ field: 'form' });
  });
});
