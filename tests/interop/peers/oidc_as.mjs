// A real single-audience authorization server for the interop tests: the npm package oidc-provider (9.x).
//
// Usage: node oidc_as.mjs '<json config>' with
//   {"module": "file:///…/node_modules/oidc-provider/lib/index.js", "port": 40123, "resources": {"<resource indicator>": <access token ttl seconds>, ...},
//    "clients": [{"client_id": "...", "client_secret": "..."} or {"client_id": "...", "jwks": {"keys": [...]}}],
//    "redirect_uris": ["http://127.0.0.1:9/callback"]}
// A client with "jwks" authenticates with private_key_jwt (ES256 client assertions) instead of a secret. DPoP
// (RFC 9449) is on, as oidc-provider 9 has it by default: a token request with a proof gets a bound JWT (cnf.jkt).
// Every resource indicator (one per MCP tool, plus the server's own URI: the aggregate) is a resource server
// whose access tokens are RS256 JWTs (typ at+jwt) with aud = that indicator. oidc-provider puts exactly one
// audience in a token: asking for several resources at the token endpoint is refused with invalid_target.
// Grants: client_credentials, authorization_code with PKCE (S256, required), refresh_token. Interactions are
// approved automatically (login as "mcp-user", consent to everything asked) so tests can run the code flow
// headless. RFC 8414 metadata is served at /.well-known/oauth-authorization-server too. Prints
// "listening <issuer>" on stdout once it accepts connections.

import { generateKeyPairSync, randomUUID } from 'node:crypto';

const config = JSON.parse(process.argv[2]);
// The package lives in the test cache, not beside this file: import it by the path the test passes.
const { default: Provider, errors } = await import(config.module);
const issuer = `http://127.0.0.1:${config.port}`;
const resources = new Map(Object.entries(config.resources));
const SUBJECT = 'mcp-user';

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg: 'RS256', use: 'sig' };

const provider = new Provider(issuer, {
  clients: config.clients.map((client) => ({
    client_id: client.client_id,
    grant_types: ['client_credentials', 'authorization_code', 'refresh_token'],
    response_types: ['code'],
    redirect_uris: config.redirect_uris,
    ...(client.jwks
      ? { jwks: client.jwks, token_endpoint_auth_method: 'private_key_jwt', token_endpoint_auth_signing_alg: 'ES256' }
      : { client_secret: client.client_secret, token_endpoint_auth_method: 'client_secret_basic' }),
  })),
  jwks: { keys: [signingKey] },
  cookies: { keys: [randomUUID()] },
  scopes: ['mcp'],
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    introspection: { enabled: false },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, indicator) => {
        if (!resources.has(indicator)) throw new errors.InvalidTarget(`unknown resource indicator ${indicator}`);
        return {
          scope: 'mcp',
          audience: indicator,
          accessTokenTTL: resources.get(indicator),
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  issueRefreshToken: (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  findAccount: (_ctx, id) => ({ accountId: id, claims: () => ({ sub: id }) }),
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
});

async function approve(ctx) {
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const { prompt, params, session } = details;
  let result;
  if (prompt.name === 'login') {
    result = { login: { accountId: SUBJECT } };
  } else {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  const location = await provider.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: true });
  ctx.status = 303;
  ctx.set('location', location);
}

provider.use(async (ctx, next) => {
  if (ctx.path === '/.well-known/oauth-authorization-server') {
    ctx.path = '/.well-known/openid-configuration';
  }
  if (ctx.method === 'GET' && /^\/interaction\/[^/]+$/.test(ctx.path)) {
    await approve(ctx);
    return;
  }
  await next();
});

provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`listening ${issuer}\n`);
});

const stop = () => process.exit(0);
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
