// agent_clis_e2e.mjs - a real agent command-line client against `kettle serve`,
// offline, with every request it sends recorded on the way.
//
//   node tests/agents/agent_clis_e2e.mjs CLIENT KETTLE_BIN
//     CLIENT: claude (Claude Code, `claude -p`), codex (`codex exec`),
//             qwen (Qwen Code, `qwen -p`) or opencode (`opencode run`),
//             the versions tests/agents/package.json pins
//   env KT_SHARED_DIR: the shared folder (default ../shared beside the repository)
//   env KT_AGENT_CAPTURE_DIR: also write every recorded request there, one
//       JSON file each (how tests/data/agent_requests was made)
//
// The client runs in its non-interactive mode in a temporary HOME (its
// config and state there, nothing of the user's), with no setting beyond
// kettle's base URL, a dummy API key, a small output cap and what keeps it
// offline (each is commented where it is set). Between the client and
// kettle a small proxy forwards every request unchanged and keeps it.
//
// The model is random-weight (test-tiny, Qwen 2's vocabulary, Qwen 3's
// template), so what it says comes from the server's side alone: each
// check's kettle serve has one class (--config) whose default request
// fields, which fill what a request does not set, are a GBNF `grammar`
// and a `logit_bias`:
//   plain turn  the grammar is the text "Hello from kettle."; the client
//               must exit 0 having printed it.
//   tool turn   the grammar is "Calling NAME.\n" and a call of one of the
//               client's own read-only tools in Qwen 3's format (Hermes:
//               <tool_call>{"name", "arguments"}</tool_call>, which kettle
//               parses into the client's API), reading hello.txt in the
//               work folder; the client must execute it: a later request
//               of it carries the tool's result for the call id kettle
//               gave, holding the file's random marker, and kettle must
//               answer that request. The model calls the tool in every
//               reply, so the client would go on forever: it is killed
//               once that answer is through.
// Beyond the model file, template and port, the servers differ from
// kettle's defaults only in that class (its grammar, logit_bias and
// a max_tokens that Codex alone leaves to it) and --cache-dir, which the
// two servers of a test share (the second finds the first's prefill).
// Under tool_choice "auto" kettle's grammar is "the class's grammar, or a
// call the model chooses"; the bias on the grammar's first token ("Hello",
// "Calling"), which no call starts with, is what picks the grammar's
// answer whatever the weights say.
//
// Each client run is bounded (CLIENT_TIMEOUT_MS); a check fails on a
// non-zero exit, a missing answer or tool result, or the time running out,
// and prints every request the client sent with kettle's status and, for
// errors, kettle's message. Exits 0 only if every check passed.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const [CLIENT, BIN] = process.argv.slice(2);
const SHARED = process.env.KT_SHARED_DIR || path.resolve(HERE, '../../../shared');
const CAPTURE = process.env.KT_AGENT_CAPTURE_DIR || '';
const TEMPLATE = path.join(SHARED, 'templates', 'Qwen-Qwen3-0.6B.jinja');
const VOCAB = path.join(SHARED, 'vocab', 'ggml-vocab-qwen2.gguf');

// A client run's bound: a plain turn of Claude Code (a 19k-token prompt,
// prefilled on two loaded cores) takes 20 to 60 s.
const CLIENT_TIMEOUT_MS = 120_000;
const SERVER_START_MS = 30_000;
// The model's training context, Qwen 3's: the clients' first prompts are
// 6k (Codex) to 19k (Claude Code) tokens, and the servers run on kettle's
// default context (the training context, at most 32768), no --ctx.
const CTX_TRAIN = 40960;
const CTX = 32768; // what the clients are told the context is
// The clients' output cap, where they have one (below): room for the tool
// turn's forced reply (about 60 tokens) and no more.
const OUTPUT_CAP = 128;
// The class's default max_tokens: Codex sends no output cap and has no
// setting for one, so the server's is its cap.
const SERVER_MAX_TOKENS = 256;
const ANSWER = 'Hello from kettle.';
// One prompt for both turns: the same prompt in the same folder renders
// the same tokens, so the second server finds the first's KV in the shared
// --cache-dir instead of prefilling it again.
const PROMPT = 'Read hello.txt, then say hi.';

// ---- the four clients ----
//
// Each: its bin in node_modules/.bin and package, the API it speaks, the
// read-only tool the tool turn makes it call, and setup(ctx), which writes
// its config under ctx.home and returns its environment and arguments.
// ctx: {home, work, file (hello.txt's absolute path), url (the proxy's
// base URL, no /v1)}.
const DUMMY_KEY = 'sk-kettle-test-dummy';

const CLIENTS = {
  claude: {
    bin: 'claude', pkg: '@anthropic-ai/claude-code', api: 'anthropic', fixture: 'claude_code_messages',
    tool: (ctx) => ({ name: 'Read', arguments: { file_path: ctx.file } }),
    setup: (ctx) => ({
      env: {
        // kettle's address; Claude Code appends /v1/messages
        ANTHROPIC_BASE_URL: ctx.url,
        // sent as x-api-key; in -p mode a key in the environment is used
        // without the interactive approval
        ANTHROPIC_API_KEY: DUMMY_KEY,
        // no auto-update, telemetry, error reporting or feedback traffic
        // (documented as the four DISABLE_* variables in one)
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
        // the output cap: its requests' max_tokens
        CLAUDE_CODE_MAX_OUTPUT_TOKENS: String(OUTPUT_CAP),
      },
      args: ['-p', PROMPT],
    }),
  },
  codex: {
    bin: 'codex', pkg: '@openai/codex', api: 'responses', fixture: 'codex_responses',
    tool: () => ({ name: 'exec_command', arguments: { cmd: 'cat hello.txt' } }),
    setup: (ctx) => {
      const dir = path.join(ctx.home, '.codex');
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(path.join(dir, 'config.toml'), [
        // a provider of its own for kettle (the built-in "openai" one
        // cannot be pointed elsewhere in config.toml): its Responses API
        // at base_url, the key read from KETTLE_API_KEY
        'model = "kettle"',
        'model_provider = "kettle"',
        // no update check at start (it would reach GitHub)
        'check_for_update_on_startup = false',
        '[model_providers.kettle]',
        'name = "kettle"',
        `base_url = "${ctx.url}/v1"`,
        'env_key = "KETTLE_API_KEY"',
        'wire_api = "responses"',
        // no usage analytics
        '[analytics]',
        'enabled = false',
        '',
      ].join('\n'));
      return {
        // CODEX_HOME: where config.toml, sessions and logs live (default ~/.codex)
        env: { CODEX_HOME: dir, KETTLE_API_KEY: DUMMY_KEY },
        // --skip-git-repo-check: exec refuses a folder outside a git
        // repository otherwise. No output cap: Codex has none to set (the
        // server's class default is it).
        args: ['exec', '--skip-git-repo-check', PROMPT],
      };
    },
  },
  qwen: {
    bin: 'qwen', pkg: '@qwen-code/qwen-code', api: 'chat', fixture: 'qwen_code_chat',
    tool: (ctx) => ({ name: 'read_file', arguments: { file_path: ctx.file } }),
    setup: (ctx) => {
      const dir = path.join(ctx.home, '.qwen');
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(path.join(dir, 'settings.json'), JSON.stringify({
        // no usage statistics, no telemetry, no update check
        privacy: { usageStatisticsEnabled: false },
        telemetry: { enabled: false },
        general: { enableAutoUpdate: false },
      }, null, 2));
      return {
        // OPENAI_API_KEY set, -p picks the OpenAI-compatible API by itself
        env: {
          OPENAI_BASE_URL: `${ctx.url}/v1`,
          OPENAI_API_KEY: DUMMY_KEY,
          // any name: kettle serves one model under every name
          OPENAI_MODEL: 'kettle',
          // the output cap: its requests' max_tokens (set this way, it is
          // also never raised to 64000 after a reply cut at the cap)
          QWEN_CODE_MAX_OUTPUT_TOKENS: String(OUTPUT_CAP),
        },
        args: ['-p', PROMPT],
      };
    },
  },
  opencode: {
    bin: 'opencode', pkg: 'opencode-ai', api: 'chat', fixture: 'opencode_chat',
    tool: (ctx) => ({ name: 'read', arguments: { filePath: ctx.file } }),
    setup: (ctx) => {
      const dir = path.join(ctx.home, '.config', 'opencode');
      fs.mkdirSync(dir, { recursive: true });
      fs.writeFileSync(path.join(dir, 'opencode.json'), JSON.stringify({
        $schema: 'https://opencode.ai/config.json',
        // no update check, no session sharing
        autoupdate: false,
        share: 'disabled',
        model: 'kettle/kettle',
        // kettle as an OpenAI-compatible provider (its SDK is bundled in the binary)
        provider: {
          kettle: {
            npm: '@ai-sdk/openai-compatible',
            name: 'kettle',
            options: { baseURL: `${ctx.url}/v1`, apiKey: DUMMY_KEY },
            // limit.output: the output cap (its requests' max_tokens)
            models: { kettle: { name: 'kettle', limit: { context: CTX, output: OUTPUT_CAP } } },
          },
        },
      }, null, 2));
      return {
        env: {
          // no fetch of the model catalogue (models.opencode.ai/api.json),
          // which it tries at every start
          OPENCODE_DISABLE_MODELS_FETCH: '1',
          // no language-server downloads, which it starts on demand when
          // a tool touches a source file
          OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
        },
        // the message as words: `opencode run` quotes an argument that
        // holds spaces
        args: ['run', ...PROMPT.split(' ')],
      };
    },
  },
};

// ---- the tool results a request carries, per API ----

function textOf(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p === 'string' ? p : p?.text ?? '')).join('');
  return '';
}

// [{id, text}] of every tool result in a request body.
function toolResults(api, body) {
  const out = [];
  if (api === 'anthropic') {
    for (const m of body?.messages ?? []) {
      for (const b of Array.isArray(m.content) ? m.content : []) {
        if (b?.type === 'tool_result') out.push({ id: b.tool_use_id, text: textOf(b.content) });
      }
    }
  } else if (api === 'responses') {
    for (const it of Array.isArray(body?.input) ? body.input : []) {
      if (it?.type === 'function_call_output') out.push({ id: it.call_id, text: textOf(it.output) });
    }
  } else {
    for (const m of body?.messages ?? []) {
      if (m?.role === 'tool') out.push({ id: m.tool_call_id, text: textOf(m.content) });
    }
  }
  return out;
}

// ---- processes: every child is killed when the test ends, however ----

const children = new Set();
function track(proc, group) {
  const entry = { proc, group };
  children.add(entry);
  proc.on('exit', () => children.delete(entry));
  return entry;
}
function killAll() {
  for (const { proc, group } of children) {
    try { group ? process.kill(-proc.pid, 'SIGKILL') : proc.kill('SIGKILL'); } catch { /* gone */ }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => { killAll(); process.exit(1); });

function startServer(config, cacheDir) {
  const proc = spawn(BIN, ['serve', '--config', config, '--port', '0', '--cache-dir', cacheDir],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  track(proc, false);
  const srv = { proc, port: 0, stderr: '', exited: null };
  proc.stderr.setEncoding('utf8');
  proc.stderr.on('data', (d) => { srv.stderr += d; });
  srv.exitedPromise = new Promise((resolve) => proc.on('exit', (code, signal) => resolve(srv.exited = { code, signal })));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`kettle serve did not listen within ${SERVER_START_MS / 1000} s:\n${srv.stderr}`)), SERVER_START_MS);
    proc.on('error', (e) => { clearTimeout(timer); reject(new Error(`cannot start ${BIN}: ${e.message}`)); });
    proc.stderr.on('data', () => {
      const m = /listening on http:\/\/[^\s:]+:(\d+)/.exec(srv.stderr);
      if (m && !srv.port) { clearTimeout(timer); srv.port = Number(m[1]); resolve(srv); }
    });
    srv.exitedPromise.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`kettle serve exited early (code ${code}, signal ${signal}):\n${srv.stderr}`));
    });
  });
}

// kettle's request log (one line each: status, prompt and cached tokens, times)
function requestLog(srv) {
  const lines = srv.stderr.split('\n').filter((l) => /^\S+Z (GET|HEAD|POST) /.test(l));
  return lines.length ? lines.map((l) => `#   ${l}`).join('\n') : '#   (none)';
}

async function stopServer(srv) {
  if (srv.exited) return srv.exited;
  srv.proc.kill('SIGTERM');
  const killer = setTimeout(() => srv.proc.kill('SIGKILL'), 5000);
  const r = await srv.exitedPromise;
  clearTimeout(killer);
  return r;
}

// ---- the recording proxy ----

// Forwards every request to kettle unchanged (body, headers but Host)
// and keeps {method, url, headers, body, status, response}; onRequest(rec)
// runs as each request has arrived whole, before it is forwarded, and
// onAnswered(rec) once kettle's answer to it is over: passed on whole, or
// cut short by the client going away (Codex closes a stream as soon as it
// has read response.completed).
function startProxy(upstreamPort, onRequest = () => {}, onAnswered = () => {}) {
  const records = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      let body = raw.toString('utf8');
      try { body = raw.length ? JSON.parse(body) : null; } catch { /* kept as text */ }
      const rec = { method: req.method, url: req.url, headers: req.headers, body, status: 0, response: '' };
      records.push(rec);
      onRequest(rec);
      const up = http.request({
        host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url,
        headers: { ...req.headers, host: `127.0.0.1:${upstreamPort}` },
      }, (ur) => {
        rec.status = ur.statusCode;
        res.writeHead(ur.statusCode, ur.headers);
        ur.on('data', (c) => {
          // kept whole up to 1 MiB: the call ids kettle gave, error messages
          if (rec.response.length < (1 << 20)) rec.response += c.toString('utf8');
          res.write(c);
        });
        ur.on('end', () => res.end());
        ur.on('close', () => onAnswered(rec));
      });
      up.on('error', (e) => {
        rec.status = 502;
        rec.response = `proxy: ${e.message}`;
        if (!res.headersSent) res.writeHead(502);
        res.end();
        onAnswered(rec);
      });
      // a client that goes away takes its kettle request with it
      res.on('close', () => { if (!res.writableFinished) up.destroy(); });
      up.end(raw);
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    records, port: server.address().port, close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  })));
}

// One line per request: method, path, kettle's status, and kettle's
// message when it refused.
function describe(records) {
  if (!records.length) return '(no request reached the proxy)';
  return records.map((r, i) => {
    let line = `#${i + 1} ${r.method} ${r.url} -> ${r.status || 'no answer'}`;
    if (r.status >= 400) line += ` ${r.response.slice(0, 400)}`;
    return line;
  }).join('\n');
}

// ---- a client run ----

// Runs the client in ctx until it exits, CLIENT_TIMEOUT_MS pass or
// stop() is called; resolves to {code, signal, stdout, stderr, timedOut,
// stopped, ms}.
function runClient(def, ctx, env, args) {
  const bin = path.join(HERE, 'node_modules', '.bin', def.bin);
  const t0 = Date.now();
  // its own process group, so that its children (shells, sandboxes) die with it
  const proc = spawn(bin, args, { cwd: ctx.work, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const entry = track(proc, true);
  const run = { stdout: '', stderr: '', timedOut: false, stopped: false };
  proc.stdout.setEncoding('utf8').on('data', (d) => { run.stdout += d; });
  proc.stderr.setEncoding('utf8').on('data', (d) => { run.stderr += d; });
  const kill = () => { try { process.kill(-proc.pid, 'SIGKILL'); } catch { /* gone */ } };
  const timer = setTimeout(() => { run.timedOut = true; kill(); }, CLIENT_TIMEOUT_MS);
  run.stop = () => { run.stopped = true; kill(); };
  run.done = new Promise((resolve) => {
    proc.on('error', (e) => { run.stderr += `spawn: ${e.message}`; });
    proc.on('close', (code, signal) => {
      clearTimeout(timer);
      children.delete(entry);
      // whatever it left in its group goes too
      kill();
      resolve(Object.assign(run, { code, signal, ms: Date.now() - t0 }));
    });
  });
  return run;
}

// A fresh HOME and work folder at the same paths for every run (the
// prompts then render the same), hello.txt in it.
function freshHome(root, marker) {
  const home = path.join(root, 'home');
  fs.rmSync(home, { recursive: true, force: true });
  const work = path.join(home, 'work');
  fs.mkdirSync(work, { recursive: true });
  const file = path.join(work, 'hello.txt');
  fs.writeFileSync(file, `${marker}\n`);
  return { home, work, file };
}

function clientEnv(ctx, extra) {
  return {
    // nothing of the user's environment (keys, proxies, config) but PATH:
    // the clients run bash, node, cat
    PATH: process.env.PATH,
    HOME: ctx.home,
    XDG_CONFIG_HOME: path.join(ctx.home, '.config'),
    XDG_DATA_HOME: path.join(ctx.home, '.local', 'share'),
    XDG_STATE_HOME: path.join(ctx.home, '.local', 'state'),
    XDG_CACHE_HOME: path.join(ctx.home, '.cache'),
    TERM: 'dumb',
    NO_COLOR: '1',
    ...extra,
  };
}

function tail(text, n = 1500) {
  return text.length > n ? `...${text.slice(-n)}` : text;
}

function writeConfig(file, model, grammar, biasToken) {
  fs.writeFileSync(file, JSON.stringify({
    models: [{
      name: 'kettle', path: model, 'chat-template': TEMPLATE,
      grammar, logit_bias: { [biasToken]: 100 }, max_tokens: SERVER_MAX_TOKENS,
    }],
  }, null, 2));
}

function gbnfString(text) {
  // JSON's escapes (\" \\ \n) are GBNF's
  return JSON.stringify(text);
}

function capture(records, phase) {
  if (!CAPTURE) return;
  fs.mkdirSync(CAPTURE, { recursive: true });
  records.forEach((r, i) => {
    const { response, ...rest } = r;
    fs.writeFileSync(path.join(CAPTURE, `${CLIENT}-${phase}-${String(i + 1).padStart(3, '0')}.json`),
      JSON.stringify({ ...rest, response: response.slice(0, 4000) }, null, 2));
  });
}

// ---- main ----

let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok - ${name}`);
  } catch (e) {
    failures++;
    const detail = e instanceof assert.AssertionError ? e.message : (e && e.stack) || String(e);
    console.log(`FAIL - ${name}: ${detail.replace(/\n/g, '\n    ')}`);
  }
}

async function main() {
  const def = CLIENTS[CLIENT];
  if (!def || !BIN) throw new Error(`usage: agent_clis_e2e.mjs ${Object.keys(CLIENTS).join('|')} KETTLE_BIN`);
  const pinned = JSON.parse(fs.readFileSync(path.join(HERE, 'package.json'), 'utf8')).dependencies[def.pkg];
  const bin = path.join(HERE, 'node_modules', '.bin', def.bin);
  if (!fs.existsSync(bin)) throw new Error(`${bin} is missing; run: npm install --prefix tests/agents`);

  const root = fs.mkdtempSync(path.join(os.tmpdir(), `kettle-agent-${CLIENT}-`));
  process.on('exit', () => fs.rmSync(root, { recursive: true, force: true }));
  const marker = `kettle-marker-${randomBytes(6).toString('hex')}`;

  await check(`${CLIENT} --version is the pinned ${pinned}`, async () => {
    const v = execFileSync(bin, ['--version'], {
      encoding: 'utf8', timeout: 30_000, stdio: ['ignore', 'pipe', 'pipe'], env: clientEnv(freshHome(root, marker), {}),
    });
    assert.ok(v.includes(pinned), `--version printed ${JSON.stringify(v.trim())}`);
  });

  const model = path.join(root, 'model.gguf');
  execFileSync(BIN, ['gen-model', '--shape', 'test-tiny', '--type', 'Q8_0', '--ctx-train', String(CTX_TRAIN), '--vocab', VOCAB, '-o', model], { stdio: 'ignore' });
  const tokenId = (text) => {
    const ids = JSON.parse(execFileSync(BIN, ['tokenize', '-m', model, '--ids', '--no-bos', text], { encoding: 'utf8' }));
    if (ids.length !== 1) throw new Error(`'${text}' is ${ids.length} tokens in this vocabulary; the bias needs one`);
    return ids[0];
  };
  const cacheDir = path.join(root, 'kv-cache');

  // plain turn
  await check(`${CLIENT}: a plain turn exits 0 with kettle's answer`, async () => {
    const ctx = freshHome(root, marker);
    const cfg = path.join(root, 'plain.json');
    writeConfig(cfg, model, `root ::= ${gbnfString(ANSWER)}`, tokenId('Hello'));
    const srv = await startServer(cfg, cacheDir);
    const proxy = await startProxy(srv.port);
    try {
      ctx.url = `http://127.0.0.1:${proxy.port}`;
      const { env, args } = def.setup(ctx);
      const r = await runClient(def, ctx, clientEnv(ctx, env), args).done;
      capture(proxy.records, 'plain');
      console.log(`# plain turn: ${(r.ms / 1000).toFixed(1)} s, ${proxy.records.length} request(s); kettle's log:\n${requestLog(srv)}`);
      const why = `\n  requests:\n${describe(proxy.records)}\n  stdout: ${tail(r.stdout)}\n  stderr: ${tail(r.stderr)}`;
      assert.ok(!r.timedOut, `no exit within ${CLIENT_TIMEOUT_MS / 1000} s${why}`);
      assert.equal(r.code, 0, `exit code ${r.code} (signal ${r.signal})${why}`);
      assert.ok(r.stdout.includes(ANSWER), `its output lacks "${ANSWER}"${why}`);
    } finally {
      await proxy.close();
      await stopServer(srv);
    }
  });

  // tool turn
  await check(`${CLIENT}: it executes the tool call kettle's model makes and sends the result back`, async () => {
    const ctx = freshHome(root, marker);
    const call = def.tool(ctx);
    const cfg = path.join(root, 'tool.json');
    const reply = `Calling ${call.name}.\n<tool_call>\n${JSON.stringify(call)}\n</tool_call>`;
    writeConfig(cfg, model, `root ::= ${gbnfString(reply)}`, tokenId('Calling'));
    const srv = await startServer(cfg, cacheDir);
    let run = null;
    let found = null;
    // a request carrying the result of a call kettle made: its id is in an
    // earlier answer of kettle's, its text holds the file's marker
    const onRequest = (rec) => {
      if (found) return;
      for (const res of toolResults(def.api, rec.body)) {
        const issued = proxy.records.some((r) => r !== rec && res.id && r.response.includes(res.id));
        if (issued && res.text.includes(marker)) {
          found = { ...res, rec, request: proxy.records.indexOf(rec) + 1 };
          return;
        }
      }
    };
    // kettle's answer to that request is part of the round trip: once it
    // is through, the client (which would call the tool again and again)
    // is stopped
    const onAnswered = (rec) => { if (found?.rec === rec) run?.stop(); };
    const proxy = await startProxy(srv.port, onRequest, onAnswered);
    try {
      ctx.url = `http://127.0.0.1:${proxy.port}`;
      const { env, args } = def.setup(ctx);
      run = runClient(def, ctx, clientEnv(ctx, env), args);
      const r = await run.done;
      capture(proxy.records, 'tool');
      console.log(`# tool turn: ${(r.ms / 1000).toFixed(1)} s, ${proxy.records.length} request(s); kettle's log:\n${requestLog(srv)}`);
      const why = `\n  requests:\n${describe(proxy.records)}\n  stdout: ${tail(r.stdout)}\n  stderr: ${tail(r.stderr)}`;
      assert.ok(found, `${r.timedOut ? `no tool result within ${CLIENT_TIMEOUT_MS / 1000} s`
        : `it exited (code ${r.code}, signal ${r.signal}) without sending the ${call.name} call's result`}${why}`);
      console.log(`# request #${found.request} carries the result of ${found.id}`);
      assert.ok(found.rec.status >= 200 && found.rec.status < 300,
        `kettle refused the request carrying the result (#${found.request})${why}`);
    } finally {
      await proxy.close();
      await stopServer(srv);
    }
  });
}

const globalTimer = setTimeout(() => {
  console.log('FAIL - global timeout');
  killAll();
  process.exit(1);
}, 2 * CLIENT_TIMEOUT_MS + 4 * SERVER_START_MS);
let code = 1;
try {
  await main();
  code = failures ? 1 : 0;
  console.log(failures ? `# ${failures} check(s) failed` : '# all checks passed');
} catch (e) {
  console.log(`FAIL - setup: ${(e && e.stack) || e}`);
} finally {
  clearTimeout(globalTimer);
  killAll();
}
process.exit(code);
