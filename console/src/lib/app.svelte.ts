// The console's state: who is signed in, the client of the API, and the page shown.
import { client, loadSession, saveSession, type Api, type Session } from './api';
import { href, parseRoute, type Route } from './routes';

class Console {
  session = $state<Session | null>(loadSession());
  route = $state<Route>(parseRoute(location.pathname, location.search));
  /** Why the user was signed out, shown on the sign-in page. */
  notice = $state<string | null>(null);
  #api: Api | null = null;

  /** The API client of the signed-in session. */
  get api(): Api {
    if (this.session === null) throw new Error('not signed in');
    this.#api ??= client(this.session, () =>
      this.signOut('This API key was not accepted: it may have been revoked or have expired. Sign in with a valid key.'),
    );
    return this.#api;
  }

  signIn(session: Session): void {
    saveSession(session);
    this.#api = null;
    this.notice = null;
    this.session = session;
  }

  signOut(notice: string | null = null): void {
    saveSession(null);
    this.#api = null;
    this.notice = notice;
    this.session = null;
  }

  /** Shows a page, adding it to the browser's history unless `replace`. */
  go(target: Route | string, replace = false): void {
    const url = typeof target === 'string' ? target : href(target);
    if (replace) history.replaceState(null, '', url);
    else history.pushState(null, '', url);
    this.sync();
    window.scrollTo(0, 0);
  }

  /** Reads the page from the address bar (after a navigation or the back button). */
  sync(): void {
    this.route = parseRoute(location.pathname, location.search);
  }
}

export const app = new Console();
