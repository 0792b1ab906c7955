// dialects_e2e.mjs - the other APIs `kettle serve` speaks, driven by their
// own clients: OpenAI's Responses API through the `openai` package and the
// OpenAI Agents SDK on its default (Responses) path, and Anthropic's
// Messages API through `@anthropic-ai/sdk`.
//
//   node tests/js/dialects_e2e.mjs [KETTLE_BIN]      (or env KT_BIN)
//   env KT_SHARED_DIR: the shared folder (default ../shared beside the repository)
//
// The model is a random-weight test-tiny file with Qwen 2.5's vocabulary and
// chat template (Hermes <tool_call> JSON). It writes nothing sensible, so
// the checks are what kettle guarantees whatever the model: each dialect's
// answer carries exactly the text the chat-completions API gives for the
// same conversation at temperature 0 (whole and streamed), its usage counts
// the same prompt, forced tool use gives calls whose arguments the schema
// accepts, a tool's result sent back in the dialect's own shape is
// answered, the SDKs' loops complete, and what kettle does not support is
// a 400 in the dialect's error shape that the SDK raises. Streams that wait
// seconds for their first token, behind another request, reach SDKs whose
// fetch gives up after 2 s of silence whole: kettle's keep-alives (pings,
// SSE comments) hold them, and the SDKs skip them.
// Prints one line per check; exits 0 only if every check passed.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { harness } from './harness.mjs';

let OpenAI, Anthropic, z, agents;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
  ({ z } = await import('zod'));
  agents = await import('@openai/agents');
} catch (e) {
  console.log(`FAIL - setup: cannot load openai, @anthropic-ai/sdk, zod or @openai/agents (${e.message}); run: npm ci --prefix tests/js`);
  process.exit(1);
}

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.argv[2] || process.env.KT_BIN;
const SHARED = process.env.KT_SHARED_DIR || path.resolve(HERE, '../../../shared');
const TMP = mkdtempSync(path.join(os.tmpdir(), 'kettle-dialects-'));
process.on('exit', () => rmSync(TMP, { recursive: true, force: true }));

const { startServer, check, run } = harness({ bin: BIN, model: '', globalTimeoutMs: 240_000 });

const CITIES = ['Paris', 'Oslo', 'Lima'];
const City = z.object({ city: z.enum(CITIES) }).strict();
const CITY_SCHEMA = z.toJSONSchema(City);
const SYSTEM = 'You answer briefly.';
const ASK = 'What is the weather in Paris?';

function makeModel() {
  const out = path.join(TMP, 'qwen.gguf');
  execFileSync(BIN, ['gen-model', '--shape', 'test-tiny', '--type', 'Q8_0', '--vocab', path.join(SHARED, 'vocab', 'ggml-vocab-qwen2.gguf'), '-o', out]);
  return out;
}

// The chat-completions answer for the same conversation: what every
// dialect must carry.
async function chatReference(openai, maxTokens) {
  const r = await openai.chat.completions.create({
    model: 'kettle', temperature: 0, max_tokens: maxTokens,
    messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: ASK }],
  });
  return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason, prompt: r.usage.prompt_tokens };
}

async function expectError(promise, Class, status, pattern) {
  let err = null;
  try { await promise; } catch (e) { err = e; }
  assert.ok(err, 'the request succeeded');
  assert.ok(err instanceof Class, `${err.constructor.name}: ${err.message}`);
  assert.equal(err.status, status, err.message);
  if (pattern) assert.match(err.message, pattern);
  return err;
}

// What OpenAI Codex CLI (0.171.0) sends on /v1/responses, reconstructed
// small enough for this server's context from Codex's ResponsesApiRequest
// (the real 8,700-token request, tests/data/agent_requests/
// codex_responses.json, is what test_agent_codex's Codex itself sends): instructions, developer / user messages, its function
// tools, an MCP server's tools under a namespace, the hosted web_search
// tool, tool_choice auto, reasoning.summary, include
// reasoning.encrypted_content, store false, prompt_cache_key and
// client_metadata (the last five cannot be turned off in Codex). The
// length is capped here only because a random-weight model never stops.
function codexRequest() {
  const fn = (name, description, properties, required) => ({
    type: 'function', name, description, strict: false,
    parameters: { type: 'object', properties, required, additionalProperties: false },
  });
  return {
    model: 'kettle',
    instructions: 'You are Codex, a coding agent. Use the tools to inspect and change the workspace.',
    input: [
      { type: 'message', role: 'developer', content: [{ type: 'input_text', text: '<permissions instructions>sandbox: workspace-write</permissions instructions>' }] },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: '<environment_context>\n  <cwd>/work</cwd>\n  <shell>bash</shell>\n</environment_context>' }] },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: ASK }] },
    ],
    tools: [
      fn('shell_command', 'Runs a shell command and returns its output.', { command: { type: 'string' }, workdir: { type: 'string' }, timeout_ms: { type: 'number' } }, ['command']),
      fn('update_plan', 'Updates the task plan.', { explanation: { type: 'string' }, plan: { type: 'array', items: { type: 'object', properties: { step: { type: 'string' }, status: { type: 'string', enum: ['pending', 'in_progress', 'completed'] } }, required: ['step', 'status'], additionalProperties: false } } }, ['plan']),
      fn('apply_patch', 'Applies a patch to files.', { input: { type: 'string' } }, ['input']),
      { type: 'namespace', name: 'mcp__weather', description: 'Tools in the mcp__weather namespace.', tools: [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: false, parameters: CITY_SCHEMA }] },
      { type: 'web_search', external_web_access: false },
    ],
    tool_choice: 'auto',
    parallel_tool_calls: false,
    reasoning: { summary: 'auto' },
    store: false,
    stream: true,
    include: ['reasoning.encrypted_content'],
    prompt_cache_key: '0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b',
    client_metadata: { 'x-codex-installation-id': '5f0c2e9a-1b7d-4c3e-9a8f-2d6b4e1c7a90' },
    max_output_tokens: 48,
  };
}

// Reads a Responses stream and checks its shape: sequence numbers 0, 1,
// ...; response.created and in_progress first; every item added is done
// once, by the same id; the final response's output is the items done, in
// order. Returns the final event.
async function wellFormed(stream) {
  let seq = -1, last = null;
  const types = [], open = new Map(), done = [];
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq + 1, `sequence_number after ${seq}`);
    seq = ev.sequence_number;
    types.push(ev.type);
    if (ev.type === 'response.output_item.added') {
      assert.ok(!open.has(ev.output_index), `output_index ${ev.output_index} added twice`);
      open.set(ev.output_index, ev.item.id);
    }
    if (ev.type === 'response.output_item.done') {
      assert.equal(ev.item.id, open.get(ev.output_index), `item ${ev.output_index} done, not added`);
      open.delete(ev.output_index);
      done.push(ev.item);
    }
    last = ev;
  }
  assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
  assert.equal(open.size, 0, 'items added and never done');
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  assert.deepEqual(last.response.output, done);
  return last;
}

async function codexChecks(openai) {
  await check('responses: a Codex request streams a well-formed answer; x-kettle-warning names the hosted tool left out', async () => {
    const { data: stream, response } = await openai.responses.create(codexRequest()).withResponse();
    assert.equal(response.status, 200);
    assert.match(response.headers.get('x-kettle-warning') || '', /hosted tools left out of the prompt.*web_search/);
    const last = await wellFormed(stream);
    assert.ok(last.response.usage.input_tokens > 0);
  });

  await check('responses: a namespaced tool is called as Codex routes it (name + namespace), and its result answered', async () => {
    const codex = codexRequest();
    const forced = { ...codex, max_output_tokens: 200, tool_choice: { type: 'function', name: 'get_weather' }, temperature: 1, seed: 7 };
    const { data: stream, response } = await openai.responses.create(forced).withResponse();
    assert.equal(response.status, 200);
    const last = await wellFormed(stream);
    const calls = last.response.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(last.response.output));
    assert.equal(calls[0].name, 'get_weather');
    assert.equal(calls[0].namespace, 'mcp__weather');
    assert.ok(City.safeParse(JSON.parse(calls[0].arguments)).success, calls[0].arguments);
    // Codex's next turn: its items replayed, the call's output appended
    const next = await openai.responses.create({
      ...codex, stream: false,
      input: [...codex.input, ...last.response.output, { type: 'function_call_output', call_id: calls[0].call_id, output: 'clear, 21 C' }],
    });
    assert.equal(next.status === 'completed' || next.status === 'incomplete', true, next.status);
    assert.ok(next.usage.input_tokens > last.response.usage.input_tokens, 'the call and its result are in the prompt');
  });
}

async function responsesChecks(openai, ref) {
  const base = { model: 'kettle', instructions: SYSTEM, input: ASK, temperature: 0, max_output_tokens: 24 };

  await check('responses: the text and usage of chat completions', async () => {
    const r = await openai.responses.create(base);
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.equal(r.output_text, ref.text);
    assert.equal(r.status, ref.finish === 'length' ? 'incomplete' : 'completed');
    if (ref.finish === 'length') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    assert.equal(r.usage.input_tokens, ref.prompt);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    assert.equal(r.store, false);
    // input as items, with a developer message and input_text parts
    const items = await openai.responses.create({
      ...base, instructions: undefined,
      input: [{ role: 'developer', content: SYSTEM }, { type: 'message', role: 'user', content: [{ type: 'input_text', text: ASK }] }],
    });
    assert.equal(items.output_text, ref.text);
  });

  await check('responses: a stream carries the same answer, in order', async () => {
    const whole = await openai.responses.create(base);
    const stream = await openai.responses.create({ ...base, stream: true });
    let text = '', seq = -1, last = null;
    const types = [];
    for await (const ev of stream) {
      assert.equal(ev.sequence_number, seq + 1, `sequence_number after ${seq}`);
      seq = ev.sequence_number;
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      last = ev;
    }
    assert.equal(types[0], 'response.created');
    assert.ok(types.includes('response.output_item.added') && types.includes('response.output_text.done'), types.join(' '));
    assert.equal(text, whole.output_text);
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
    assert.equal(last.response.output[0].content[0].text, whole.output_text);
    assert.equal(last.response.usage.input_tokens, whole.usage.input_tokens);
  });

  await check('responses: forced tool use, its result sent back, answered', async () => {
    const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: CITY_SCHEMA, strict: true }];
    const r = await openai.responses.create({ ...base, max_output_tokens: 200, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 1, seed: 7 });
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    assert.equal(calls[0].name, 'get_weather');
    assert.ok(City.safeParse(JSON.parse(calls[0].arguments)).success, calls[0].arguments);
    assert.match(calls[0].call_id, /^call_/);
    const next = await openai.responses.create({
      ...base, tools, tool_choice: 'none',
      input: [{ role: 'user', content: ASK }, calls[0], { type: 'function_call_output', call_id: calls[0].call_id, output: 'clear, 21 C' }],
    });
    assert.equal(next.output.filter((o) => o.type === 'function_call').length, 0);
    assert.equal(typeof next.output_text, 'string');
    assert.ok(next.usage.input_tokens > r.usage.input_tokens, 'the call and its result are in the prompt');
    // a named function, streamed: the arguments deltas make the done item
    const stream = await openai.responses.create({ ...base, max_output_tokens: 200, tools, tool_choice: { type: 'function', name: 'get_weather' }, stream: true });
    let args = '', done = null;
    for await (const ev of stream) {
      if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
      if (ev.type === 'response.output_item.done' && ev.item.type === 'function_call') done = ev.item;
    }
    assert.ok(done, 'no function_call item');
    assert.equal(done.arguments, args);
    assert.ok(City.safeParse(JSON.parse(args)).success, args);
  });

  await check('responses: text.format json_schema gives JSON the schema accepts', async () => {
    const r = await openai.responses.create({ ...base, max_output_tokens: 200, temperature: 1, seed: 3, text: { format: { type: 'json_schema', name: 'city', schema: CITY_SCHEMA, strict: true } } });
    assert.ok(City.safeParse(JSON.parse(r.output_text)).success, r.output_text);
  });

  await check('responses: what kettle does not do is a 400 (or 404) the SDK raises', async () => {
    await expectError(openai.responses.create({ ...base, previous_response_id: 'resp_1' }), OpenAI.BadRequestError, 400, /whole conversation in 'input'/);
    await expectError(openai.responses.create({ ...base, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }] }), OpenAI.BadRequestError, 400, /--mmproj/);
    // a hosted tool is left out under tool_choice auto, refused when forced
    await expectError(openai.responses.create({ ...base, tools: [{ type: 'web_search' }], tool_choice: { type: 'web_search' } }), OpenAI.BadRequestError, 400, /web_search/);
    await expectError(openai.responses.create({ ...base, include: ['message.output_text.logprobs'] }), OpenAI.BadRequestError, 400, /logprobs/);
    await expectError(openai.responses.create({ ...base, background: true }), OpenAI.BadRequestError, 400, /background/);
    await expectError(openai.responses.retrieve('resp_1'), OpenAI.NotFoundError, 404, /does not store/);
  });
}

async function agentsChecks(openai) {
  const { Agent, run: runAgent, tool, OpenAIResponsesModel, setTracingDisabled } = agents;
  setTracingDisabled(true);
  const makeAgent = (ran) => new Agent({
    name: 'weather',
    instructions: 'Answer with the weather.',
    tools: [tool({ name: 'get_weather', description: 'Weather of a city', parameters: City, execute: async (input) => (ran.push(input), 'clear, 21 C') })],
    model: new OpenAIResponsesModel(openai, 'kettle'),
    // required on the first turn; the SDK resets tool_choice after a call
    modelSettings: { toolChoice: 'required', temperature: 1, maxTokens: 300, parallelToolCalls: false },
  });
  await check('agents SDK (Responses path): the agent calls its tool and finishes', async () => {
    const ran = [];
    const result = await runAgent(makeAgent(ran), ASK, { maxTurns: 4 });
    assert.ok(ran.length >= 1, 'the tool ran');
    for (const input of ran) assert.ok(City.safeParse(input).success, JSON.stringify(input));
    assert.equal(typeof result.finalOutput, 'string');
  });
  await check('agents SDK (Responses path), streamed: the same loop completes', async () => {
    const ran = [];
    const result = await runAgent(makeAgent(ran), ASK, { maxTurns: 4, stream: true });
    for await (const _ of result) { /* drain the events */ }
    await result.completed;
    assert.ok(ran.length >= 1, 'the tool ran');
    assert.equal(typeof result.finalOutput, 'string');
  });
}

async function anthropicChecks(anthropic, ref, baseURL) {
  const base = { model: 'kettle', system: SYSTEM, messages: [{ role: 'user', content: ASK }], temperature: 0, max_tokens: 24 };
  const text = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

  await check('messages: the text and usage of chat completions', async () => {
    const m = await anthropic.messages.create(base);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(text(m), ref.text);
    assert.equal(m.stop_reason, ref.finish === 'length' ? 'max_tokens' : 'end_turn');
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, ref.prompt);
    assert.ok(m.usage.cache_read_input_tokens > 0, 'the second time the prompt comes from the prefix cache');
    const blocks = await anthropic.messages.create({ ...base, system: [{ type: 'text', text: SYSTEM }], messages: [{ role: 'user', content: [{ type: 'text', text: ASK, cache_control: { type: 'ephemeral' } }] }] });
    assert.equal(text(blocks), ref.text);
    const counted = await anthropic.messages.countTokens({ model: 'kettle', system: SYSTEM, messages: base.messages });
    assert.equal(counted.input_tokens, ref.prompt);
  });

  await check('messages: a stream carries the same answer, in order', async () => {
    const whole = await anthropic.messages.create(base);
    const types = [];
    let deltas = '';
    const stream = anthropic.messages.stream(base);
    stream.on('streamEvent', (ev) => types.push(ev.type));
    stream.on('text', (t) => { deltas += t; });
    const final = await stream.finalMessage();
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.ok(types.includes('content_block_start') && types.includes('message_delta'), types.join(' '));
    assert.equal(deltas, text(whole));
    assert.deepEqual(final.content, whole.content);
    assert.equal(final.stop_reason, whole.stop_reason);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  });

  await check('messages: stop_sequences end the reply and name the one that matched', async () => {
    const whole = await anthropic.messages.create({ ...base, max_tokens: 40 });
    const t = text(whole);
    assert.ok(t.length >= 8, `a reply of ${t.length} characters`);
    const stop = [...t].slice(3, 5).join('');
    const m = await anthropic.messages.create({ ...base, max_tokens: 40, stop_sequences: ['never-in-it', stop] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(text(m), t.slice(0, t.indexOf(stop)));
  });

  await check('messages: forced tool use, its result sent back, answered', async () => {
    const tools = [{ name: 'get_weather', description: 'Weather of a city', input_schema: CITY_SCHEMA }];
    const m = await anthropic.messages.create({ ...base, max_tokens: 200, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true }, temperature: 1, top_k: 40 });
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    assert.equal(uses[0].name, 'get_weather');
    assert.ok(City.safeParse(uses[0].input).success, JSON.stringify(uses[0].input));
    const convo = [{ role: 'user', content: ASK }, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: 'clear, 21 C' }] }];
    const next = await anthropic.messages.create({ ...base, tools, tool_choice: { type: 'none' }, messages: convo });
    assert.equal(next.content.filter((b) => b.type === 'tool_use').length, 0);
    assert.ok(['end_turn', 'max_tokens'].includes(next.stop_reason), next.stop_reason);
    const counted = await anthropic.messages.countTokens({ model: 'kettle', system: SYSTEM, tools, tool_choice: { type: 'none' }, messages: convo });
    assert.equal(counted.input_tokens, next.usage.input_tokens + next.usage.cache_read_input_tokens);
    // a named tool, streamed: the SDK assembles the same input
    const named = { ...base, max_tokens: 200, tools, tool_choice: { type: 'tool', name: 'get_weather' } };
    const whole = await anthropic.messages.create(named);
    const streamed = await anthropic.messages.stream(named).finalMessage();
    const noIds = (c) => c.map(({ id, ...rest }) => (assert.match(id || 'call_x', /^call_/), rest));
    assert.deepEqual(noIds(streamed.content), noIds(whole.content)); // ids are fresh per request
    assert.equal(streamed.stop_reason, 'tool_use');
  });

  await check('messages: what kettle does not do is a 400 in Anthropic\'s error shape', async () => {
    const err = await expectError(anthropic.messages.create({ ...base, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }), Anthropic.BadRequestError, 400, /image/);
    assert.equal(err.error.type, 'error');
    assert.equal(err.error.error.type, 'invalid_request_error');
    // Anthropic's own tools: left out under auto (said in x-kettle-warning), refused when forced
    const webSearch = [{ type: 'web_search_20250305', name: 'web_search' }];
    const { data, response } = await anthropic.messages.create({ ...base, tools: webSearch }).withResponse();
    assert.equal(data.type, 'message');
    assert.match(response.headers.get('x-kettle-warning') ?? '', /tools\[0\] \(web_search_20250305 'web_search'\) left out/);
    await expectError(anthropic.messages.create({ ...base, tools: webSearch, tool_choice: { type: 'tool', name: 'web_search' } }), Anthropic.BadRequestError, 400, /Anthropic's own tools/);
    // a schema bound past the grammar's limit (Claude Code's Workflow tool): enforced as far as it can be, said
    const workflow = [{ name: 'Workflow', input_schema: { type: 'object', properties: { script: { type: 'string', maxLength: 524288 } }, required: ['script'] } }];
    const wf = await anthropic.messages.create({ ...base, tools: workflow }).withResponse();
    assert.equal(wf.data.type, 'message');
    assert.match(wf.response.headers.get('x-kettle-warning') ?? '', /tool 'Workflow': at \/properties\/script: string length maximum 524288 not enforced/);
    const raw = await fetch(`${baseURL}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages: base.messages }) });
    assert.equal(raw.status, 400);
    assert.deepEqual(Object.keys(await raw.json()), ['type', 'error']);
  });
}

// A fetch that gives up on a body silent for ms, as clients and proxies
// with an idle timeout do; raw[path] collects each body as it came.
function idleFetch(ms, raw) {
  return async (url, init = {}) => {
    const idle = new AbortController();
    const signal = init.signal ? AbortSignal.any([init.signal, idle.signal]) : idle.signal;
    const res = await fetch(url, { ...init, signal });
    const path = new URL(url).pathname, text = new TextDecoder();
    let timer;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => idle.abort(new Error(`${path}: no byte for ${ms} ms`)), ms);
    };
    arm();
    const body = res.body.pipeThrough(new TransformStream({
      transform(chunk, out) { arm(); raw[path] = (raw[path] || '') + text.decode(chunk, { stream: true }); out.enqueue(chunk); },
      flush() { clearTimeout(timer); },
    }));
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Streams queued behind a long generation on a one-sequence server, each
// silent until the test cancels that generation (4 s): SDKs giving up
// after 2 s without a byte get every event and the same text as a whole
// answer, while the raw bodies show the keep-alives they skipped (SSE
// comments while queued, on Messages too: pings only after message_start,
// which waits for the first token). The
// wait does not depend on the machine's speed: the blocker asks for 32000
// tokens, without speculation, and is cut at 4 s (a check says so if it
// ever ends sooner).
async function quietStreamChecks(root) {
  const IDLE_MS = 2000, WAIT_MS = 4000;
  const raw = {};
  const fetchIdle = idleFetch(IDLE_MS, raw);
  const openai = new OpenAI({ baseURL: `${root}/v1`, apiKey: 'none', fetch: fetchIdle, maxRetries: 0 });
  const anthropic = new Anthropic({ baseURL: root, apiKey: 'none', fetch: fetchIdle, maxRetries: 0 });
  const chatBase = { model: 'kettle', temperature: 0, max_tokens: 12, messages: [{ role: 'user', content: ASK }] };
  const respBase = { model: 'kettle', temperature: 0, max_output_tokens: 12, input: ASK };
  const msgBase = { model: 'kettle', temperature: 0, max_tokens: 12, messages: [{ role: 'user', content: ASK }] };
  const refChat = (await openai.chat.completions.create(chatBase)).choices[0].message.content;
  const refResp = (await openai.responses.create(respBase)).output_text;
  const refMsg = (await anthropic.messages.create(msgBase)).content.map((b) => b.text || '').join('');
  for (const k of Object.keys(raw)) delete raw[k];

  const blocker = new AbortController();
  const blocked = await fetch(`${root}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, signal: blocker.signal,
    body: JSON.stringify({ prompt: 'Once', max_tokens: 32000, ignore_eos: true, temperature: 0, stream: true }),
  });
  let blockerEnded = false;
  const blockerRead = (async () => {
    try { for await (const c of blocked.body) if (new TextDecoder().decode(c).includes('[DONE]')) blockerEnded = true; } catch { /* cut */ }
  })();
  const t0 = Date.now();
  const firstText = {};
  const seen = (api) => { firstText[api] ??= Date.now() - t0; };
  const chat = (async () => {
    let text = '';
    for await (const ch of await openai.chat.completions.create({ ...chatBase, stream: true })) {
      assert.equal(ch.object, 'chat.completion.chunk');
      const d = ch.choices[0]?.delta?.content;
      if (d) seen('chat'), text += d;
    }
    return text;
  })();
  const resp = (async () => {
    let text = '', seq = -1;
    for await (const ev of await openai.responses.create({ ...respBase, stream: true })) {
      assert.equal(ev.sequence_number, seq + 1, `sequence_number after ${seq}`);
      seq = ev.sequence_number;
      if (ev.type === 'response.output_text.delta') seen('responses'), text += ev.delta;
    }
    return text;
  })();
  const msg = (async () => {
    const types = [];
    let text = '';
    const stream = anthropic.messages.stream(msgBase);
    stream.on('streamEvent', (ev) => types.push(ev.type));
    stream.on('text', (t) => { seen('messages'); text += t; });
    await stream.finalMessage();
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.ok(!types.includes('ping'), 'the SDK passed a ping on');
    return text;
  })();
  const all = Promise.all([chat, resp, msg]);
  all.catch(() => {}); // awaited below, after the blocker is cut
  await sleep(WAIT_MS);
  assert.ok(!blockerEnded, `the blocker's 32000 tokens took under ${WAIT_MS} ms: the streams did not wait`);
  blocker.abort();
  const [chatText, respText, msgText] = await all;
  await blockerRead;
  assert.equal(chatText, refChat);
  assert.equal(respText, refResp);
  assert.equal(msgText, refMsg);
  for (const api of ['chat', 'responses', 'messages'])
    assert.ok(firstText[api] >= WAIT_MS - 500, `${api}: its first text after ${firstText[api]} ms`);
  // the comment on every API while queued (Messages' message_start waits for the first token, and its
  // pings only follow it)
  const comments = (s) => (s || '').split('\n').filter((l) => l === ': keep-alive').length;
  for (const p of ['/v1/chat/completions', '/v1/responses', '/v1/messages'])
    assert.ok(comments(raw[p]) >= 2, `${p}: ${raw[p]}`);
  const m = raw['/v1/messages'];
  assert.ok(m.indexOf('event: message_start') < m.indexOf('event: ping') && !m.slice(m.indexOf('event: message_start')).includes(': keep-alive'), m);
}

await run(async () => {
  const model = makeModel();
  const srv = await startServer(['--alias', 'kettle', '--ctx', '2048', '--chat-template', path.join(SHARED, 'templates/Qwen-Qwen2.5-7B-Instruct.jinja')], { model });
  const root = `http://127.0.0.1:${srv.port}`;
  const openai = new OpenAI({ baseURL: `${root}/v1`, apiKey: 'none' });
  const ref = await chatReference(openai, 24);
  await responsesChecks(openai, ref);
  await codexChecks(openai);
  await agentsChecks(openai);
  await anthropicChecks(new Anthropic({ baseURL: root, apiKey: 'none' }), ref, root);

  const keyed = await startServer(['--api-key', 'sekrit', '--ctx', '512'], { model });
  const keyedRoot = `http://127.0.0.1:${keyed.port}`;
  await check('messages: x-api-key authenticates; a wrong key is a 401 authentication_error', async () => {
    const ok = await new Anthropic({ baseURL: keyedRoot, apiKey: 'sekrit' }).messages.create({ model: 'any', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(ok.type, 'message');
    const err = await expectError(new Anthropic({ baseURL: keyedRoot, apiKey: 'wrong' }).messages.create({ model: 'any', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }), Anthropic.AuthenticationError, 401);
    assert.equal(err.error.error.type, 'authentication_error');
    await expectError(new OpenAI({ baseURL: `${keyedRoot}/v1`, apiKey: 'wrong' }).responses.create({ model: 'any', input: 'hi', max_output_tokens: 4 }), OpenAI.AuthenticationError, 401);
  });

  const single = await startServer(['--alias', 'kettle', '--parallel', '1', '--ctx', '32768', '--spec', 'off'], { model });
  await check('streams silent for seconds behind another request: keep-alives hold SDKs with a 2 s idle timeout, which skip them', () => quietStreamChecks(`http://127.0.0.1:${single.port}`));
});
