// The variables of a query: the run form generated from their declarations, and the declarations themselves.
import type { Variable, VariableType } from './api';

export const VARIABLE_TYPES: VariableType[] = ['String', 'Number', 'Integer', 'Boolean', 'Date', 'DateTime', 'List'];

/** The input a run form shows for a type. */
export type InputKind = 'text' | 'number' | 'checkbox' | 'date' | 'datetime-local' | 'list';

export function inputKind(type: VariableType): InputKind {
  switch (type) {
    case 'Number':
    case 'Integer':
      return 'number';
    case 'Boolean':
      return 'checkbox';
    case 'Date':
      return 'date';
    case 'DateTime':
      return 'datetime-local';
    case 'List':
      return 'list';
    default:
      return 'text';
  }
}

/** What a form field holds: text for every input but the checkbox. */
export type RawValue = string | boolean;

/** A parsed field: the JSON value for the run body, nothing (the declaration's default applies), or why not. */
export type Parsed = { value: unknown } | { omitted: true } | { error: string };

const DATE = /^\d{4}-\d{2}-\d{2}$/;
// What a datetime-local input gives: minutes, and seconds when the user typed them.
const LOCAL_DATETIME = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})(:\d{2}(\.\d+)?)?$/;
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

/** The items of a list field: one per line or comma, numbers kept as numbers. */
export function listItems(raw: string): (string | number)[] {
  return raw
    .split(/[\n,]/)
    .map((item) => item.trim())
    .filter((item) => item !== '')
    .map((item) => (/^-?\d+(\.\d+)?$/.test(item) ? Number(item) : item));
}

/** Turns what a field holds into the JSON value the service expects for the type. */
export function parseValue(type: VariableType, raw: RawValue): Parsed {
  if (typeof raw === 'boolean') return type === 'Boolean' ? { value: raw } : { error: 'Enter a value.' };
  const text = raw.trim();
  if (text === '') return { omitted: true };
  switch (type) {
    case 'Number': {
      const value = Number(text);
      return Number.isFinite(value) ? { value } : { error: 'Enter a number.' };
    }
    case 'Integer': {
      const value = Number(text);
      return Number.isSafeInteger(value) ? { value } : { error: 'Enter a whole number.' };
    }
    case 'Date':
      return DATE.test(text) && !Number.isNaN(Date.parse(text)) ? { value: text } : { error: 'Enter a date (YYYY-MM-DD).' };
    case 'DateTime': {
      if (RFC3339.test(text)) return { value: text };
      const local = LOCAL_DATETIME.exec(text);
      // The form's date-time is in UTC, as the label says: the service compares with UTC timestamps.
      return local ? { value: `${local[1]}T${local[2]}${local[3] ?? ':00'}Z` } : { error: 'Enter a date and time.' };
    }
    case 'List':
      return { value: listItems(text) };
    case 'Boolean':
      return text === 'true' || text === 'false' ? { value: text === 'true' } : { error: 'Choose true or false.' };
    default:
      return { value: text };
  }
}

/** A declared default as the field shows it. */
export function formatValue(type: VariableType, value: unknown): RawValue {
  if (value === null || value === undefined) return type === 'Boolean' ? false : '';
  switch (type) {
    case 'Boolean':
      return value === true;
    case 'List':
      return Array.isArray(value) ? value.join(', ') : String(value);
    case 'DateTime': {
      // datetime-local shows minutes in UTC; an offset other than Z is converted.
      const ms = Date.parse(String(value));
      return Number.isNaN(ms) ? String(value) : new Date(ms).toISOString().slice(0, 19);
    }
    default:
      return String(value);
  }
}

/** The run body's variables from the form, or the errors by variable name. */
export function runVariables(
  declared: Record<string, Variable>,
  raw: Record<string, RawValue>,
): { variables: Record<string, unknown>; errors: Record<string, string> } {
  const variables: Record<string, unknown> = {};
  const errors: Record<string, string> = {};
  for (const [name, declaration] of Object.entries(declared)) {
    const parsed = parseValue(declaration.type, raw[name] ?? formatValue(declaration.type, declaration.default));
    if ('error' in parsed) errors[name] = parsed.error;
    else if ('value' in parsed) variables[name] = parsed.value;
    else if (declaration.required) errors[name] = 'Required.';
  }
  return { variables, errors };
}

/** The names a query uses as `{variables.NAME}`, in order of first use. */
export function usedVariables(sql: string): string[] {
  const names = [...sql.matchAll(/\{\s*variables\.([A-Za-z_][A-Za-z0-9_]*)\s*\}/g)].map((m) => m[1] as string);
  return [...new Set(names)];
}

/** A declaration being edited in the form. The default is text (`true`/`false` for a Boolean), empty for none. */
export interface DeclarationDraft {
  name: string;
  type: VariableType;
  default: string;
  required: boolean;
  description: string;
}

export function draftOf(name: string, variable: Variable): DeclarationDraft {
  const shown = formatValue(variable.type, variable.default);
  return {
    name,
    type: variable.type,
    default: variable.default === null || variable.default === undefined ? '' : String(shown),
    required: variable.required,
    description: variable.description ?? '',
  };
}

export function newDraft(name: string): DeclarationDraft {
  return { name, type: 'String', default: '', required: true, description: '' };
}

export interface Declaration {
  type: VariableType;
  default?: unknown;
  required: boolean;
  description: string | null;
}

/** The `variables` of a query body from the drafts, or the errors of their defaults by variable name. */
export function declarations(drafts: DeclarationDraft[]): {
  variables: Record<string, Declaration>;
  errors: Record<string, string>;
} {
  const variables: Record<string, Declaration> = {};
  const errors: Record<string, string> = {};
  for (const draft of drafts) {
    const name = draft.name.trim();
    if (name === '') continue;
    const parsed = parseValue(draft.type, draft.default);
    if ('error' in parsed) {
      errors[name] = `Default: ${parsed.error}`;
      continue;
    }
    const description = draft.description.trim();
    variables[name] = {
      type: draft.type,
      ...('value' in parsed ? { default: parsed.value } : {}),
      required: draft.required,
      description: description === '' ? null : description,
    };
  }
  return { variables, errors };
}
