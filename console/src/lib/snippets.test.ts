import { describe, expect, it } from 'vitest';
import type { Endpoint } from './api';
import { curlLine, pascalCase, shellQuote, typescriptSnippet } from './snippets';

const endpoint = {
  name: 'events-by-country',
  endpoint_path: '/api/projects/1/endpoints/events-by-country/run',
  current_version: 2,
  query: {
    kind: 'SQLQuery',
    query: 'SELECT 1',
    variables: {
      since: { type: 'Date', default: null, required: true, description: null },
      countries: { type: 'List', default: ['US'], required: false, description: null },
    },
  },
  columns: [
    { name: 'country', type: 'string' },
    { name: 'events', type: 'integer' },
    { name: 'avg revenue', type: 'float' },
  ],
} satisfies Pick<Endpoint, 'name' | 'endpoint_path' | 'current_version' | 'query' | 'columns'>;

describe('snippets', () => {
  it('quotes for the shell, quotes included', () => {
    expect(shellQuote("it's")).toBe(`'it'\\''s'`);
  });

  it('writes a curl line with the variables and the key as a shell variable', () => {
    const line = curlLine('http://127.0.0.1:8000', endpoint, { since: "2026-03-01'" });
    expect(line).toContain(`curl -s -X POST 'http://127.0.0.1:8000/api/projects/1/endpoints/events-by-country/run'`);
    expect(line).toContain('-H "Authorization: Bearer $ENDPOINTS_API_KEY"');
    expect(line).toContain(`-d '{"variables":{"since":"2026-03-01'\\''"}}'`);
    expect(curlLine('http://h', endpoint, {}, 'phx_abc')).toContain(`-H 'Authorization: Bearer phx_abc'`);
  });

  it('types the variables and the rows of the endpoint', () => {
    expect(pascalCase('events-by-country')).toBe('EventsByCountry');
    const ts = typescriptSnippet('http://h', endpoint);
    expect(ts).toContain('export interface EventsByCountryVariables {\n  since: string;\n  countries?: (string | number | boolean)[];\n}');
    expect(ts).toContain('  country: string | null;\n  events: number | null;\n  "avg revenue": number | null;');
    expect(ts).toContain('export async function runEventsByCountry(apiKey: string, variables: EventsByCountryVariables)');
    expect(ts).toContain('"http://h/api/projects/1/endpoints/events-by-country/run"');
    expect(ts).toContain('http://h/api/projects/1/endpoints/events-by-country/openapi.json');
  });
});
