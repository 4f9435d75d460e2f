// The console's client-side routes, all under /console/ (the server answers index.html for each of them).

export const BASE = '/console';

export type Tab = 'run' | 'versions' | 'materialization' | 'logs' | 'usage' | 'share';
export const TABS: Tab[] = ['run', 'versions', 'materialization', 'logs', 'usage', 'share'];

export type Route =
  | { page: 'endpoints' }
  | { page: 'new-endpoint' }
  | { page: 'endpoint'; name: string; tab: Tab; version?: number }
  | { page: 'edit-endpoint'; name: string }
  | { page: 'tables' }
  | { page: 'table'; name: string }
  | { page: 'not-found'; path: string };

function segment(raw: string): string | null {
  try {
    return decodeURIComponent(raw);
  } catch {
    return null;
  }
}

export function parseRoute(pathname: string, search = ''): Route {
  const path = pathname.startsWith(BASE) ? pathname.slice(BASE.length) : pathname;
  const parts = path.split('/').filter((part) => part !== '').map(segment);
  if (parts.some((part) => part === null)) return { page: 'not-found', path: pathname };
  const [first, second, third, ...rest] = parts as string[];
  if (rest.length > 0) return { page: 'not-found', path: pathname };
  if (first === undefined || (first === 'endpoints' && second === undefined)) return { page: 'endpoints' };
  if (first === 'endpoints' && second === 'new' && third === undefined) return { page: 'new-endpoint' };
  if (first === 'endpoints' && second !== undefined && third === undefined) {
    const params = new URLSearchParams(search);
    const tab = params.get('tab');
    const version = Number(params.get('version'));
    return {
      page: 'endpoint',
      name: second,
      tab: TABS.includes(tab as Tab) ? (tab as Tab) : 'run',
      ...(Number.isSafeInteger(version) && version > 0 ? { version } : {}),
    };
  }
  if (first === 'endpoints' && second !== undefined && third === 'edit') return { page: 'edit-endpoint', name: second };
  if (first === 'tables' && second === undefined) return { page: 'tables' };
  if (first === 'tables' && second !== undefined && third === undefined) return { page: 'table', name: second };
  return { page: 'not-found', path: pathname };
}

export function href(route: Route): string {
  const name = 'name' in route ? encodeURIComponent(route.name) : '';
  switch (route.page) {
    case 'endpoints':
      return `${BASE}/`;
    case 'new-endpoint':
      return `${BASE}/endpoints/new`;
    case 'endpoint':
    {
      const params = new URLSearchParams();
      if (route.tab !== 'run') params.set('tab', route.tab);
      if (route.version !== undefined) params.set('version', String(route.version));
      const query = params.toString();
      return `${BASE}/endpoints/${name}${query === '' ? '' : `?${query}`}`;
    }
    case 'edit-endpoint':
      return `${BASE}/endpoints/${name}/edit`;
    case 'tables':
      return `${BASE}/tables`;
    case 'table':
      return `${BASE}/tables/${name}`;
    case 'not-found':
      return route.path;
  }
}
