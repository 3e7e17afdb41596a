// A stock TypeScript SDK client (@modelcontextprotocol/sdk, StreamableHTTPClientTransport with default
// reconnection) driven by tests/interop/test_sdk_clients.py. It prints one JSON line per observation.
//
// usage: node ts_sdk_client.mjs URL TOOL ARGUMENTS_JSON [SWAP_AT_PROGRESS]
// env:   MCP_TS_SDK           directory of the installed @modelcontextprotocol/sdk package
//        MCP_TOKEN            bearer token sent on every request
//        MCP_NARROW_TOKEN     token sent instead once progress SWAP_AT_PROGRESS has arrived
//        MCP_CALL_TIMEOUT_MS  the tools/call request timeout (the SDK's default is 60000)
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [url, tool, argumentsJson, swapAt] = process.argv.slice(2);
const sdk = process.env.MCP_TS_SDK;
const load = (path) => import(pathToFileURL(join(sdk, 'dist', 'esm', path)).href);
const { Client } = await load('client/index.js');
const { StreamableHTTPClientTransport } = await load('client/streamableHttp.js');

const started = performance.now();
const emit = (event, fields = {}) =>
  process.stdout.write(JSON.stringify({ event, t: Math.round(performance.now() - started), ...fields }) + '\n');

let token = process.env.MCP_TOKEN;
const withToken = (input, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set('authorization', `Bearer ${token}`);
  return fetch(input, { ...init, headers });
};

const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: withToken });
const client = new Client({ name: 'ts-sdk-peer', version: '1.0.0' });
client.onerror = (error) => emit('transport_error', { message: String(error?.message ?? error) });
await client.connect(transport);
emit('initialized', { server: client.getServerVersion(), protocol: transport.protocolVersion ?? null });

const listed = await client.listTools();
emit('tools', { tools: listed.tools.map((t) => ({ name: t.name, meta: t._meta ?? null })) });

try {
  const result = await client.callTool({ name: tool, arguments: JSON.parse(argumentsJson) }, undefined, {
    timeout: Number(process.env.MCP_CALL_TIMEOUT_MS ?? 60000),
    onprogress: (p) => {
      emit('progress', { progress: p.progress, total: p.total ?? null, message: p.message ?? null });
      if (swapAt !== undefined && p.progress === Number(swapAt)) {
        token = process.env.MCP_NARROW_TOKEN;
        emit('swap');
      }
    },
  });
  emit('result', { isError: result.isError ?? false, text: result.content?.[0]?.text ?? null });
} catch (error) {
  emit('error', { code: error?.code ?? null, message: String(error?.message ?? error), data: error?.data ?? null });
}
await client.close();
emit('closed');
process.exit(0);
