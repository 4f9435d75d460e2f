import { describe, expect, it } from 'vitest';
import { href, parseRoute, type Route } from './routes';

describe('routes', () => {
  it('reads every page from its path', () => {
    expect(parseRoute('/console/')).toEqual({ page: 'endpoints' });
    expect(parseRoute('/console')).toEqual({ page: 'endpoints' });
    expect(parseRoute('/console/endpoints/new')).toEqual({ page: 'new-endpoint' });
    expect(parseRoute('/console/endpoints/daily-revenue', '?tab=versions')).toEqual({
      page: 'endpoint',
      name: 'daily-revenue',
      tab: 'versions',
    });
    expect(parseRoute('/console/endpoints/daily-revenue', '?tab=bogus&version=x')).toEqual({
      page: 'endpoint',
      name: 'daily-revenue',
      tab: 'run',
    });
    expect(parseRoute('/console/endpoints/a/edit')).toEqual({ page: 'edit-endpoint', name: 'a' });
    expect(parseRoute('/console/tables/events')).toEqual({ page: 'table', name: 'events' });
    expect(parseRoute('/console/nope')).toEqual({ page: 'not-found', path: '/console/nope' });
    expect(parseRoute('/console/endpoints/%E0%A4%A')).toMatchObject({ page: 'not-found' });
  });

  it('writes paths that read back as the same route', () => {
    const routes: Route[] = [
      { page: 'endpoints' },
      { page: 'new-endpoint' },
      { page: 'endpoint', name: 'a-b', tab: 'run' },
      { page: 'endpoint', name: 'a', tab: 'share' },
      { page: 'endpoint', name: 'a', tab: 'run', version: 3 },
      { page: 'edit-endpoint', name: 'x' },
      { page: 'tables' },
      { page: 'table', name: 'Orders_EU' },
    ];
    for (const route of routes) {
      const url = new URL(href(route), 'http://h');
      expect(parseRoute(url.pathname, url.search)).toEqual(route);
    }
  });
});
