// A stock TypeScript SDK 2.x client (@modelcontextprotocol/client, StreamableHTTPClientTransport) driven by
// tests/interop/test_modern_clients.py. It prints one JSON line per observation.
//
// usage: node ts_client_v2.mjs URL MODE TOOL ARGUMENTS_JSON
//        MODE is a revision to pin (`versionNegotiation: { mode: { pin: MODE } }`, e.g. 2026-07-28), `auto`
//        (server/discover first, falling back to initialize), or `legacy` (the SDK's default: initialize)
// env:   MCP_TS_CLIENT  directory of the installed @modelcontextprotocol/client package
//        MCP_TOKEN      bearer token sent on every request
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [url, mode, tool, argumentsJson] = process.argv.slice(2);
const entry = pathToFileURL(join(process.env.MCP_TS_CLIENT, 'dist', 'index.mjs')).href;
const { Client, StreamableHTTPClientTransport } = await import(entry);

const emit = (event, fields = {}) => process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');

const withToken = (input, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set('authorization', `Bearer ${process.env.MCP_TOKEN}`);
  return fetch(input, { ...init, headers });
};

const versionNegotiation = mode === 'legacy' || mode === 'auto' ? { mode } : { mode: { pin: mode } };
const client = new Client({ name: 'ts-client-v2-peer', version: '1.0.0' }, { versionNegotiation });
client.onerror = (error) => emit('transport_error', { message: String(error?.message ?? error) });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { fetch: withToken }));
emit('connected', {
  protocol: client.getNegotiatedProtocolVersion() ?? null,
  era: client.getProtocolEra() ?? null,
  server: client.getServerVersion() ?? null,
});

const listed = await client.listTools();
emit('tools', { tools: listed.tools.map((t) => t.name) });

try {
  const result = await client.callTool(
    { name: tool, arguments: JSON.parse(argumentsJson) },
    { onprogress: (p) => emit('progress', { progress: p.progress, total: p.total ?? null }) },
  );
  emit('result', { isError: result.isError ?? false, text: result.content?.[0]?.text ?? null });
} catch (error) {
  emit('error', { code: error?.code ?? null, message: String(error?.message ?? error) });
}
await client.close();
emit('closed');
process.exit(0);
