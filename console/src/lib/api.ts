// The console's only way to the service: its public REST API, typed from the service's own OpenAPI document
// (`src/api/openapi.json`, held equal to `/api/schema` by a test of the server), so an API change that breaks
// the console fails `npm run build`.
import createClient, { type Middleware } from 'openapi-fetch';
import type { components, paths } from '../api/schema';

export type Schemas = components['schemas'];
export type Endpoint = Schemas['Endpoint'];
export type EndpointPage = Schemas['EndpointPage'];
export type EndpointCreate = Schemas['EndpointCreate'];
export type EndpointUpdate = Schemas['EndpointUpdate'];
export type Version = Schemas['Version'];
export type Materialization = Schemas['Materialization'];
export type RunRequest = Schemas['RunRequest'];
export type RunResult = Schemas['RunResult'];
export type Table = Schemas['Table'];
export type Preview = Schemas['Preview'];
export type ErrorBody = Schemas['Error'];
export type LogEntry = Schemas['LogEntry'];
export type LogList = Schemas['LogList'];
export type Usage = Schemas['Usage'];
export type UsageBucket = Schemas['UsageBucketBody'];
export type Column = Schemas['Column'];
export type Query = Schemas['Query'];
export type Variable = Schemas['Variable'];
export type VariableType = Variable['type'];
export type SyncFrequency = NonNullable<Endpoint['sync_frequency']>;
export type RefreshMode = NonNullable<RunRequest['refresh']>;

/** A failed call, as a person should read it. */
export class Problem extends Error {
  constructor(
    /** HTTP status; 0 when the server could not be reached. */
    readonly status: number,
    readonly code: string,
    /** The server's sentence for a person. */
    readonly detail: string,
    /** The field at fault (`query`, `variables.since`, ...), or null. */
    readonly attr: string | null = null,
    /** Seconds to wait, from `Retry-After` on a 429. */
    readonly retryAfter: number | null = null,
  ) {
    super(detail);
  }
}

/** What to tell the user about a failed call, in words rather than JSON. */
export function describe(problem: Problem): string {
  switch (true) {
    case problem.status === 0:
      return 'The server cannot be reached. Check that it is running and try again.';
    case problem.status === 401:
      return 'This API key was not accepted: it may be mistyped, revoked or expired. Sign in again with a valid key.';
    case problem.status === 403:
      return `Not allowed: ${problem.detail}`;
    case problem.status === 429: {
      const wait = problem.retryAfter;
      const when = wait === null ? 'in a moment' : `in ${wait} second${wait === 1 ? '' : 's'}`;
      return `Too many requests for now. Try again ${when}.`;
    }
    case problem.status === 503:
      return `The service is briefly unavailable: ${problem.detail} Try again in a moment.`;
    case problem.status >= 500:
      return `The server failed to answer (error ${problem.status}). Try again; if it persists, tell the operator.`;
    default:
      return problem.detail;
  }
}

/** A Problem from a response whose status is not a success. */
export async function problemOf(response: Response, body?: unknown): Promise<Problem> {
  let error = body as Partial<ErrorBody> | undefined;
  if (error === undefined) {
    try {
      error = (await response.clone().json()) as Partial<ErrorBody>;
    } catch {
      error = undefined;
    }
  }
  const retry = Number.parseInt(response.headers.get('Retry-After') ?? '', 10);
  return new Problem(
    response.status,
    typeof error?.code === 'string' ? error.code : 'error',
    typeof error?.detail === 'string' ? error.detail : `${response.status} ${response.statusText}`.trim(),
    typeof error?.attr === 'string' ? error.attr : null,
    Number.isFinite(retry) ? retry : null,
  );
}

/** Where the console signs in: the key (kept in this tab's session storage only) and the project. */
export interface Session {
  key: string;
  /** A project id, or `@current` for the project the key belongs to. */
  project: string;
  /** The project's name, as the API answered it at sign-in. */
  name?: string;
}

const STORAGE_KEY = 'endpoints.session';

export function loadSession(storage: Storage = sessionStorage): Session | null {
  try {
    const raw = storage.getItem(STORAGE_KEY);
    const parsed = raw === null ? null : (JSON.parse(raw) as Partial<Session>);
    if (typeof parsed?.key !== 'string' || typeof parsed.project !== 'string') return null;
    const session: Session = { key: parsed.key, project: parsed.project };
    if (typeof parsed.name === 'string') session.name = parsed.name;
    return session;
  } catch {
    return null;
  }
}

export function saveSession(session: Session | null, storage: Storage = sessionStorage): void {
  if (session === null) storage.removeItem(STORAGE_KEY);
  else storage.setItem(STORAGE_KEY, JSON.stringify(session));
}

/** A typed client of the public API that sends the session's key and turns every failure into a Problem. */
export function client(session: Session, onUnauthorized: () => void = () => {}) {
  // JSON is the only media type the console reads.
  const api = createClient<paths, 'application/json'>({ baseUrl: location.origin });
  const auth: Middleware = {
    onRequest({ request }) {
      request.headers.set('Authorization', `Bearer ${session.key}`);
      return request;
    },
    async onResponse({ response }) {
      if (response.status === 401) onUnauthorized();
      return response;
    },
  };
  api.use(auth);
  return api;
}

export type Api = ReturnType<typeof client>;

/** The data of an openapi-fetch answer, or its failure as a Problem (a network failure is status 0). */
export async function ok<T>(
  call: Promise<{ data?: T; error?: unknown; response: Response }>,
): Promise<T> {
  let answer;
  try {
    answer = await call;
  } catch (err) {
    throw new Problem(0, 'unreachable', err instanceof Error ? err.message : String(err));
  }
  if (answer.response.ok) return answer.data as T;
  throw await problemOf(answer.response, answer.error);
}
