// The TypeScript SDK (@modelcontextprotocol/sdk) as a machine client uses it: it registers itself with the
// SDK's registerClient (RFC 7591), holds a token narrowed to one tool, and lets ClientCredentialsProvider
// step up after the server's 403 insufficient_scope. Driven by tests/interop/test_stock_client_stepup.py;
// prints one JSON line per observation.
//
// usage: node ts_sdk_stepup.mjs MCP_URL ISSUER NARROW_RESOURCE FETCH_URL
// env:   MCP_TS_SDK   directory of the installed @modelcontextprotocol/sdk package
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [url, issuer, narrowResource, fetchUrl] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(join(process.env.MCP_TS_SDK, 'dist', 'esm', path)).href);
const { Client } = await load('client/index.js');
const { StreamableHTTPClientTransport } = await load('client/streamableHttp.js');
const { discoverAuthorizationServerMetadata, registerClient, fetchToken } = await load('client/auth.js');
const { ClientCredentialsProvider } = await load('client/auth-extensions.js');

const emit = (event, fields = {}) => process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
const audience = (token) => JSON.parse(Buffer.from(token.split('.')[1], 'base64url').toString()).aud;

const metadata = await discoverAuthorizationServerMetadata(issuer);
const registration = await registerClient(issuer, {
  metadata,
  clientMetadata: {
    client_name: 'ts-sdk-acceptance',
    redirect_uris: [],
    grant_types: ['client_credentials'],
    token_endpoint_auth_method: 'client_secret_basic',
  },
});
emit('registered', { client_id: registration.client_id });

const provider = new ClientCredentialsProvider({
  clientId: registration.client_id,
  clientSecret: registration.client_secret,
  clientName: 'ts-sdk-acceptance',
});
const narrowed = await fetchToken(provider, issuer, { metadata, resource: new URL(narrowResource) });
provider.saveTokens(narrowed);
emit('narrowed', { aud: audience(narrowed.access_token) });

const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
const client = new Client({ name: 'ts-sdk-acceptance', version: '1.0.0' });
client.onerror = (error) => emit('transport_error', { message: String(error?.message ?? error) });
await client.connect(transport);
emit('initialized', { protocol: transport.protocolVersion ?? null });
try {
  const result = await client.callTool({ name: 'fetch', arguments: { url: fetchUrl } });
  emit('result', { isError: result.isError ?? false, text: result.content?.[0]?.text ?? null });
} catch (error) {
  emit('error', { code: error?.code ?? null, message: String(error?.message ?? error) });
}
emit('token', { aud: audience(provider.tokens().access_token) });
await client.close();
emit('closed');
process.exit(0);
