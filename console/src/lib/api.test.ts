import { describe as group, expect, it } from 'vitest';
import { describe, Problem, problemOf } from './api';

group('failures', () => {
  it('read as sentences, never as JSON', () => {
    expect(describe(new Problem(401, 'not_authenticated', 'The API key is not valid.'))).toMatch(/^This API key was not accepted/);
    expect(describe(new Problem(403, 'permission_denied', "This action needs the scope 'table:read'."))).toBe(
      "Not allowed: This action needs the scope 'table:read'.",
    );
    expect(describe(new Problem(429, 'rate_limited', 'x', null, 1))).toBe('Too many requests for now. Try again in 1 second.');
    expect(describe(new Problem(429, 'rate_limited', 'x'))).toBe('Too many requests for now. Try again in a moment.');
    expect(describe(new Problem(500, 'error', 'x'))).toMatch(/error 500/);
    expect(describe(new Problem(0, 'unreachable', 'Failed to fetch'))).toMatch(/cannot be reached/);
    expect(describe(new Problem(400, 'invalid', 'name must start with a letter.', 'name'))).toBe('name must start with a letter.');
  });

  it('are read from the error body and Retry-After', async () => {
    const response = new Response(JSON.stringify({ type: 'throttled', code: 'throttled', detail: 'Slow down.', attr: null }), {
      status: 429,
      headers: { 'Retry-After': '3', 'Content-Type': 'application/json' },
    });
    const problem = await problemOf(response);
    expect([problem.status, problem.code, problem.detail, problem.attr, problem.retryAfter]).toEqual([429, 'throttled', 'Slow down.', null, 3]);
    const html = await problemOf(new Response('<html>', { status: 502, statusText: 'Bad Gateway' }));
    expect([html.code, html.detail]).toEqual(['error', '502 Bad Gateway']);
  });
});
