// Ready-to-use calls of an endpoint: a curl line and a typed TypeScript function.
import type { Column, Endpoint, VariableType } from './api';

/** Quotes a word for a POSIX shell. */
export function shellQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

/** A curl line that runs the endpoint with these variables; the key is a shell variable unless given. */
export function curlLine(origin: string, endpoint: Pick<Endpoint, 'endpoint_path'>, variables: Record<string, unknown>, key?: string): string {
  const auth = key === undefined ? '"Authorization: Bearer $ENDPOINTS_API_KEY"' : shellQuote(`Authorization: Bearer ${key}`);
  const body = Object.keys(variables).length === 0 ? '{}' : JSON.stringify({ variables });
  return [
    `curl -s -X POST ${shellQuote(origin + endpoint.endpoint_path)}`,
    `  -H ${auth}`,
    `  -H 'Content-Type: application/json'`,
    `  -d ${shellQuote(body)}`,
  ].join(' \\\n');
}

/** `events-by-country` → `EventsByCountry`. */
export function pascalCase(name: string): string {
  return name
    .split(/[-_]+/)
    .filter((part) => part !== '')
    .map((part) => part[0]!.toUpperCase() + part.slice(1))
    .join('');
}

function variableType(type: VariableType): string {
  switch (type) {
    case 'Number':
    case 'Integer':
      return 'number';
    case 'Boolean':
      return 'boolean';
    case 'List':
      return '(string | number | boolean)[]';
    default:
      return 'string';
  }
}

function columnType(type: Column['type']): string {
  switch (type) {
    case 'integer':
    case 'float':
      return 'number';
    case 'boolean':
      return 'boolean';
    case 'string':
    case 'date':
    case 'datetime':
    case 'decimal':
      return 'string';
    case 'array':
      return 'unknown[]';
    default:
      return 'unknown';
  }
}

/** A property name as TypeScript accepts it. */
function property(name: string): string {
  return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(name) ? name : JSON.stringify(name);
}

/** A TypeScript function that runs the endpoint, with its variables and rows typed. */
export function typescriptSnippet(origin: string, endpoint: Pick<Endpoint, 'name' | 'endpoint_path' | 'current_version' | 'query' | 'columns'>): string {
  const type = pascalCase(endpoint.name);
  const variables = Object.entries(endpoint.query.variables).map(
    ([name, v]) => `  ${property(name)}${v.required ? '' : '?'}: ${variableType(v.type)};`,
  );
  const columns = (endpoint.columns ?? []).map((c) => `  ${property(c.name)}: ${columnType(c.type)} | null;`);
  const openapi = endpoint.endpoint_path.replace(/\/run$/, '/openapi.json');
  return `// Runs the endpoint '${endpoint.name}' (version ${endpoint.current_version} when this was written).
// Its OpenAPI document, for a generated client: ${origin}${openapi}
export interface ${type}Variables {
${variables.join('\n')}
}

export interface ${type}Row {
${columns.join('\n')}
}

export async function run${type}(apiKey: string, variables: ${type}Variables): Promise<${type}Row[]> {
  const response = await fetch(${JSON.stringify(origin + endpoint.endpoint_path)}, {
    method: 'POST',
    headers: { Authorization: \`Bearer \${apiKey}\`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ variables }),
  });
  const body = await response.json();
  if (!response.ok) throw new Error(\`\${response.status} \${body.code}: \${body.detail}\`);
  return body.results as ${type}Row[];
}
`;
}
