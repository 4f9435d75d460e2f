// Where the server's 400 points: its `attr` mapped to the field of the endpoint form that shows the message.

export type FormField =
  | { field: 'name' | 'description' | 'query' | 'cache_age_seconds' | 'form' }
  | { field: 'variable'; name: string };

export function fieldOf(attr: string | null): FormField {
  if (attr === null) return { field: 'form' };
  const variable = /^(?:query\.)?variables\.([^.]+)/.exec(attr);
  if (variable) return { field: 'variable', name: variable[1] as string };
  if (attr === 'query' || attr.startsWith('query.')) return { field: 'query' };
  if (attr === 'name' || attr === 'description' || attr === 'cache_age_seconds') return { field: attr };
  return { field: 'form' };
}
