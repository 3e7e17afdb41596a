// A stock TypeScript SDK server (@modelcontextprotocol/sdk: McpServer + StreamableHTTPServerTransport,
// stateful, resumable) driven by tests/interop/test_client_vs_ts_sdk_server.py. On stdout it prints the plain
// line "ready <port>" once listening, then one JSON line per observation: a "request" per HTTP request
// (method, session, Last-Event-ID, Accept, protocol version, JSON-RPC method, tool) and a "replay" per resume
// (stream, cursor, events sent).
//
// usage: node ts_sdk_server.mjs PORT    (0 picks a free port; the ready line names it)
// env:   MCP_TS_SDK  directory of the installed @modelcontextprotocol/sdk package
//
// Tools: search(query) and fetch(url), each with steps (default 3), delay_ms (default 20) and close_at
// (default 0 = never). They report one progress notification per step when the call carries a progressToken.
// After progress step close_at the tool closes its own SSE stream (SEP-1699 polling, the transport's
// closeSSEStream for this request) and waits until the client has resumed that stream (GET + Last-Event-ID),
// so the remaining events go live onto the resumed stream rather than all being replayed. A cancelled call
// prints a "cancelled" line with the tool's label (`search '<query>'`, `fetch <url>`).
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';

const [portArgument] = process.argv.slice(2);
const sdk = process.env.MCP_TS_SDK;
const load = (path) => import(pathToFileURL(join(sdk, 'dist', 'esm', path)).href);
const { McpServer } = await load('server/mcp.js');
const { StreamableHTTPServerTransport } = await load('server/streamableHttp.js');
const { isInitializeRequest } = await load('types.js');
// zod is the SDK's own dependency: resolve it from the SDK's directory, not from this file's.
const { z } = createRequire(join(sdk, 'package.json'))('zod');

const RETRY_MS = 200;
const RESUME_WAIT_MS = 5000;

const emit = (event, fields = {}) => process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');

/** One session's events. A store per session keeps the standalone stream id `_GET_stream` (the same in
 * every session) from mixing sessions; ids are `<stream>:<seq>`, so an id names exactly one stream. */
class SessionEventStore {
  #events = new Map(); // event id -> { streamId, message }, in insertion order
  #seq = 0;
  #streamOfToken = new Map(); // progressToken -> stream id that carried its progress
  #resumeWaiters = new Map(); // stream id -> resolve functions

  async storeEvent(streamId, message) {
    const eventId = `${streamId}:${++this.#seq}`;
    this.#events.set(eventId, { streamId, message });
    const token = message.method === 'notifications/progress' ? message.params?.progressToken : undefined;
    if (token !== undefined) this.#streamOfToken.set(token, streamId);
    return eventId;
  }

  async getStreamIdForEventId(eventId) {
    return this.#events.get(eventId)?.streamId;
  }

  /** Sends the same stream's events after `lastEventId`; iterating the live map also sends events
   * stored while the replay runs. Priming events (empty messages) are cursors, not messages. */
  async replayEventsAfter(lastEventId, { send }) {
    const { streamId } = this.#events.get(lastEventId);
    let after = false;
    let count = 0;
    for (const [eventId, event] of this.#events) {
      if (after && event.streamId === streamId && Object.keys(event.message).length > 0) {
        await send(eventId, event.message);
        count += 1;
      }
      after ||= eventId === lastEventId;
    }
    emit('replay', { stream: streamId, after: lastEventId, count });
    for (const resolve of this.#resumeWaiters.get(streamId) ?? []) resolve();
    this.#resumeWaiters.delete(streamId);
    return streamId;
  }

  /** Resolves once the stream that carried `token`'s progress has been resumed; rejects after a bound. */
  resumed(token) {
    const streamId = this.#streamOfToken.get(token);
    return new Promise((resolve, reject) => {
      const fail = () => reject(new Error(`no resume of stream ${streamId} within ${RESUME_WAIT_MS} ms`));
      const timer = setTimeout(fail, RESUME_WAIT_MS);
      const waiters = this.#resumeWaiters.get(streamId) ?? [];
      waiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
      this.#resumeWaiters.set(streamId, waiters);
    });
  }
}

const pacing = {
  steps: z.number().int().min(1).max(50).default(3),
  delay_ms: z.number().int().min(0).max(2000).default(20),
  close_at: z.number().int().min(0).default(0),
};

/** Runs `steps` steps, reporting progress and closing the stream after `close_at`. A cancelled call
 * (notifications/cancelled, or the session's end) stops at once and is logged as "cancelled". */
async function work(label, { steps, delay_ms, close_at }, extra, store) {
  const token = extra._meta?.progressToken;
  if (close_at > 0 && token === undefined) throw new Error('close_at needs a progressToken to find its stream');
  try {
    for (let step = 1; step <= steps; step++) {
      await sleep(delay_ms, undefined, { signal: extra.signal });
      if (token !== undefined) {
        await extra.sendNotification({
          method: 'notifications/progress',
          params: { progressToken: token, progress: step, total: steps, message: `${label} step ${step}` },
        });
      }
      if (step === close_at) {
        if (extra.closeSSEStream === undefined) throw new Error('the transport offers no closeSSEStream');
        const resumed = store.resumed(token);
        extra.closeSSEStream();
        await resumed;
      }
    }
  } catch (error) {
    if (extra.signal.aborted) emit('cancelled', { label });
    throw error;
  }
}

function buildServer(store) {
  const server = new McpServer({ name: 'ts-sdk-peer', version: '1.0.0' });
  server.registerTool(
    'search',
    { description: 'Search, one progress step at a time.', inputSchema: { query: z.string(), ...pacing } },
    async ({ query, ...options }, extra) => {
      await work(`search '${query}'`, options, extra, store);
      return { content: [{ type: 'text', text: `search results for '${query}'` }] };
    },
  );
  server.registerTool(
    'fetch',
    { description: 'Fetch a URL, one progress step at a time.', inputSchema: { url: z.string(), ...pacing } },
    async ({ url, ...options }, extra) => {
      await work(`fetch ${url}`, options, extra, store);
      return { content: [{ type: 'text', text: `contents of ${url}` }] };
    },
  );
  return server;
}

const transports = new Map(); // session id -> transport

const reply = (res, status, code, message) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null }));
};

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function handle(req, res) {
  const sessionId = req.headers['mcp-session-id'];
  let body;
  if (req.method === 'POST') {
    try {
      body = await readJson(req);
    } catch {
      reply(res, 400, -32700, 'Parse error: Invalid JSON');
      return;
    }
  }
  emit('request', {
    method: req.method,
    session: sessionId ?? null,
    lastEventId: req.headers['last-event-id'] ?? null,
    accept: req.headers.accept ?? null,
    protocolVersion: req.headers['mcp-protocol-version'] ?? null,
    rpc: Array.isArray(body) ? body.map((m) => m.method ?? null) : (body?.method ?? null),
    tool: body?.method === 'tools/call' ? body.params?.name : null,
  });
  const existing = sessionId === undefined ? undefined : transports.get(sessionId);
  if (existing !== undefined) {
    await existing.handleRequest(req, res, body);
  } else if (sessionId !== undefined) {
    reply(res, 404, -32001, 'Session not found');
  } else if (!isInitializeRequest(body)) {
    reply(res, 400, -32000, 'Bad Request: No valid session ID provided');
  } else {
    const store = new SessionEventStore();
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      eventStore: store,
      retryInterval: RETRY_MS,
      onsessioninitialized: (id) => transports.set(id, transport),
    });
    transport.onclose = () => transports.delete(transport.sessionId);
    await buildServer(store).connect(transport);
    await transport.handleRequest(req, res, body);
  }
}

const http = createServer((req, res) => {
  handle(req, res).catch((error) => {
    emit('handler_error', { message: String(error?.message ?? error) });
    if (!res.headersSent) reply(res, 500, -32603, 'Internal error');
  });
});
http.listen(Number(portArgument), '127.0.0.1', () => process.stdout.write(`ready ${http.address().port}\n`));
