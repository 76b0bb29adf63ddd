// The signed-in token. It is kept in session storage (gone when the tab closes, never sent
// anywhere but this server, never in a URL). The GraphiQL page reads the same key to preset
// its Authorization header.

const KEY = 'leasehold.token';

export type Role = 'tenant' | 'operator' | 'auditor' | 'agent';

/** Who the token says its holder is. The server checks the signature; the page only needs to
 * know which views to show, so it reads the claims without checking them. */
export interface Session {
  token: string;
  role: Role;
  subject: string;
  tenant?: string;
  expires?: Date;
}

/** Why a pasted text cannot be a token. */
export class NotAToken extends Error {}

/** The claims of `token`, or `NotAToken` saying why it cannot be one. */
export function sessionOf(pasted: string): Session {
  const token = pasted.trim().replace(/^Bearer\s+/i, '');
  const parts = token.split('.');
  if (parts.length !== 3 || parts.some((part) => !/^[A-Za-z0-9_-]+$/.test(part))) {
    throw new NotAToken('That is not a token: a token is three dot-separated parts (a JWT).');
  }
  let claims: Record<string, unknown>;
  try {
    const json = atob(parts[1].replace(/-/g, '+').replace(/_/g, '/'));
    claims = JSON.parse(json) as Record<string, unknown>;
  } catch {
    throw new NotAToken('That token cannot be read: its claims are not JSON.');
  }
  const role = claims.role;
  if (role !== 'tenant' && role !== 'operator' && role !== 'auditor' && role !== 'agent') {
    throw new NotAToken('That token names no role this dashboard knows.');
  }
  const expires = typeof claims.exp === 'number' ? new Date(claims.exp * 1000) : undefined;
  if (expires && expires.getTime() <= Date.now()) {
    throw new NotAToken(`That token expired at ${expires.toLocaleString()}.`);
  }
  return {
    token,
    role,
    subject: typeof claims.sub === 'string' ? claims.sub : '',
    tenant: typeof claims.tenant === 'string' ? claims.tenant : undefined,
    expires,
  };
}

/** The session kept in this tab, if any. */
export function stored(): Session | undefined {
  const token = sessionStorage.getItem(KEY);
  if (!token) return undefined;
  try {
    return sessionOf(token);
  } catch {
    sessionStorage.removeItem(KEY);
    return undefined;
  }
}

export function keep(session: Session): void {
  sessionStorage.setItem(KEY, session.token);
}

export function forget(): void {
  sessionStorage.removeItem(KEY);
}
