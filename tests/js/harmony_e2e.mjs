// harmony_e2e.mjs - gpt-oss's chat format (harmony: analysis, commentary and
// final channels) end to end through the clients agents use: chat
// completions and the Responses API through the `openai` package, the
// Messages API through `@anthropic-ai/sdk`, whole and streamed.
//
//   node tests/js/harmony_e2e.mjs [KETTLE_BIN]      (or env KT_BIN)
//   env KT_SHARED_DIR: the shared folder (default ../shared beside the repository)
//
// The model is a random-weight gpt-oss-tiny file (gen-model: the gpt-oss
// architecture, MODEL_SHAPE below) with Llama 3's vocabulary (gpt-oss's o200k is not in shared/vocab;
// Llama 3's byte-level BPE is its nearest kin, and the markers are text in
// it) and gpt-oss's real template. Three classes of it:
//   oss        as it is: free text, reasoning_effort;
//   oss-tools  the 7 tokens that can take "<|channel|>" into "analysis"
//              made e^50 times less likely, so that under tool_choice
//              required the reply takes the commentary channel (a random
//              model that opens the analysis channel there never closes
//              it; test_server_tools' GPTOSS_BIAS): tool calls;
//   oss-think  a grammar that writes the channel markers (the model the
//              words): an analysis message, then a final one.
// What is checked is what kettle guarantees whatever the model: calls whose
// arguments the schema accepts, in each API's shape, the stream carrying the
// same calls and text as the whole answer; the analysis channel as
// reasoning_content / a reasoning item / a thinking block, never in the
// text; the analysis sent back with a call rendered into the next prompt;
// reasoning effort reaching the template (the prefix cache tells), and a
// level gpt-oss does not know refused in the API's error shape.
// About 20 s in Release on a shared 2-core machine.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { harness } from './harness.mjs';

let OpenAI, Anthropic, z;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
  ({ z } = await import('zod'));
} catch (e) {
  console.log(`FAIL - setup: cannot load openai, @anthropic-ai/sdk or zod (${e.message}); run: npm ci --prefix tests/js`);
  process.exit(1);
}

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.argv[2] || process.env.KT_BIN;
const SHARED = process.env.KT_SHARED_DIR || path.resolve(HERE, '../../../shared');
const TMP = mkdtempSync(path.join(os.tmpdir(), 'kettle-harmony-'));
process.on('exit', () => rmSync(TMP, { recursive: true, force: true }));

const { startServer, check, run } = harness({ bin: BIN, model: '', globalTimeoutMs: 240_000 });

const MODEL_SHAPE = 'gpt-oss-tiny';
const TEMPLATE = path.join(SHARED, 'templates/openai-gpt-oss-120b.jinja');
const City = z.object({ city: z.enum(['Paris', 'Oslo', 'Lima']) }).strict();
const CITY_SCHEMA = z.toJSONSchema(City);
const ASK = 'What is the weather in Paris?';
const MARKERS = /<\|(channel|message|start|end|call|constrain|return)\|>/;
// two words of a-z in each channel, the markers written by the grammar
const HARMONY_GBNF = 'root ::= "<|channel|>analysis<|message|>" w " " w "<|end|><|start|>assistant<|channel|>final<|message|>" w " " w\n'
  + 'w ::= [a-z] [a-z]? [a-z]? [a-z]? [a-z]? [a-z]? [a-z]? [a-z]?\n';
const TWO_WORDS = /^[a-z]{1,8} [a-z]{1,8}$/;

function makeModel() {
  const out = path.join(TMP, 'oss.gguf');
  execFileSync(BIN, ['gen-model', '--shape', MODEL_SHAPE, '--type', 'Q8_0', '--vocab', path.join(SHARED, 'vocab', 'ggml-vocab-llama-bpe.gguf'), '-o', out]);
  return out;
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

async function chatChecks(openai) {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: CITY_SCHEMA } }];
  const base = { model: 'oss-tools', messages: [{ role: 'user', content: ASK }], tools, max_tokens: 120, temperature: 1, seed: 5 };

  await check('chat: required and a named function give one valid call, streamed as the same call', async () => {
    for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
      const r = await openai.chat.completions.create({ ...base, tool_choice });
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r));
      assert.equal(m.content, null);
      assert.equal(m.tool_calls.length, 1);
      assert.equal(m.tool_calls[0].function.name, 'get_weather');
      assert.ok(City.safeParse(JSON.parse(m.tool_calls[0].function.arguments)).success, m.tool_calls[0].function.arguments);
      let args = '', name = null, roles = 0, finishes = 0, text = '';
      for await (const ch of await openai.chat.completions.create({ ...base, tool_choice, stream: true })) {
        const d = ch.choices[0]?.delta ?? {};
        if (d.role) roles++;
        if (ch.choices[0]?.finish_reason) finishes++;
        if (d.content) text += d.content;
        for (const tc of d.tool_calls ?? []) {
          assert.equal(tc.index, 0);
          if (tc.id) { assert.equal(name, null, 'the call announced twice'); name = tc.function.name; }
          args += tc.function?.arguments ?? '';
        }
      }
      assert.equal(roles, 1);
      assert.equal(finishes, 1);
      assert.equal(text, '');
      assert.equal(name, 'get_weather');
      assert.equal(args, m.tool_calls[0].function.arguments);
    }
  });

  await check('chat: none and auto give text, no call, no marker', async () => {
    for (const tool_choice of ['none', 'auto']) {
      const r = await openai.chat.completions.create({ ...base, model: 'oss', tool_choice, max_tokens: 12, temperature: 0 });
      const m = r.choices[0].message;
      assert.equal(m.tool_calls ?? null, null, JSON.stringify(r));
      assert.equal(typeof m.content, 'string');
      assert.doesNotMatch(m.content, MARKERS);
    }
  });

  await check('chat: the analysis channel is reasoning_content, the final one content, streamed alike', async () => {
    const req = { model: 'oss-think', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 120, temperature: 1, seed: 2 };
    const r = await openai.chat.completions.create(req);
    const m = r.choices[0].message;
    assert.match(m.reasoning_content ?? '', TWO_WORDS, JSON.stringify(r));
    assert.match(m.content ?? '', TWO_WORDS, JSON.stringify(r));
    let reasoning = '', content = '';
    for await (const ch of await openai.chat.completions.create({ ...req, stream: true })) {
      reasoning += ch.choices[0]?.delta?.reasoning_content ?? '';
      content += ch.choices[0]?.delta?.content ?? '';
    }
    assert.equal(reasoning, m.reasoning_content);
    assert.equal(content, m.content);
  });

  await check('chat: the analysis sent back with a call (reasoning_content) is in the next prompt', async () => {
    const turn = (assistant) => openai.chat.completions.create({
      model: 'oss', tools, max_tokens: 1, temperature: 0,
      messages: [{ role: 'user', content: ASK },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc123', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }], ...assistant },
        { role: 'tool', tool_call_id: 'call_abc123', content: 'clear, 21 C' }],
    });
    const without = await turn({});
    const withIt = await turn({ reasoning_content: 'The user wants the weather in Paris; get_weather gives it.' });
    assert.ok(withIt.usage.prompt_tokens >= without.usage.prompt_tokens + 12, `${without.usage.prompt_tokens} -> ${withIt.usage.prompt_tokens}`);
  });

  await check('chat: reasoning_effort reaches the template; one gpt-oss does not know is a 400', async () => {
    const effort = async (reasoning_effort) => (await openai.chat.completions.create({
      model: 'oss', messages: [{ role: 'user', content: ASK }], tools, max_tokens: 1, temperature: 0, reasoning_effort,
    })).usage;
    await effort('low');
    const again = await effort('low'), high = await effort('high');
    assert.ok(again.prompt_tokens_details.cached_tokens > again.prompt_tokens / 2, JSON.stringify(again));
    assert.ok(high.prompt_tokens_details.cached_tokens < high.prompt_tokens / 2, JSON.stringify(high)); // differs at "Reasoning:"
    for (const bad of ['minimal', 'max']) {
      const err = await expectError(effort(bad), OpenAI.BadRequestError, 400, /gpt-oss's levels/);
      assert.equal(err.param, 'reasoning_effort');
    }
  });
}

async function responsesChecks(openai) {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: CITY_SCHEMA, strict: true }];
  const base = { model: 'oss-tools', input: ASK, tools, max_output_tokens: 120, temperature: 1 };

  await check('responses: function tools under required and named, whole and streamed', async () => {
    for (const tool_choice of ['required', { type: 'function', name: 'get_weather' }]) {
      const r = await openai.responses.create({ ...base, tool_choice, reasoning: { effort: 'low' } });
      const calls = r.output.filter((o) => o.type === 'function_call');
      assert.equal(calls.length, 1, JSON.stringify(r.output));
      assert.equal(calls[0].name, 'get_weather');
      assert.ok(City.safeParse(JSON.parse(calls[0].arguments)).success, calls[0].arguments);
      assert.equal(r.output.filter((o) => o.type === 'message').length, 0);
      let args = '', done = null;
      for await (const ev of await openai.responses.create({ ...base, tool_choice, stream: true })) {
        if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
        if (ev.type === 'response.output_item.done' && ev.item.type === 'function_call') done = ev.item;
      }
      assert.ok(done, 'no function_call item');
      assert.equal(done.arguments, args);
      assert.ok(City.safeParse(JSON.parse(args)).success, args);
    }
  });

  await check('responses: the analysis channel is a reasoning item, the final one the message, streamed alike', async () => {
    const req = { model: 'oss-think', input: 'Hi', max_output_tokens: 120, temperature: 0, reasoning: { effort: 'high', summary: 'auto' } };
    const r = await openai.responses.create(req);
    const [rs, msg] = r.output;
    assert.equal(rs.type, 'reasoning', JSON.stringify(r.output));
    assert.match(rs.content[0].text, TWO_WORDS);
    assert.equal(rs.summary[0].text, rs.content[0].text);
    assert.equal(msg.type, 'message');
    assert.match(r.output_text, TWO_WORDS);
    let thought = '', text = '';
    for await (const ev of await openai.responses.create({ ...req, stream: true })) {
      if (ev.type === 'response.reasoning_text.delta') thought += ev.delta;
      if (ev.type === 'response.output_text.delta') text += ev.delta;
    }
    assert.equal(thought, rs.content[0].text);
    assert.equal(text, r.output_text);
  });

  await check('responses: a reasoning item before the call is in the next prompt; an unknown effort is a 400 on reasoning.effort', async () => {
    const call = { type: 'function_call', call_id: 'call_abc123', name: 'get_weather', arguments: '{"city":"Paris"}' };
    const result = { type: 'function_call_output', call_id: 'call_abc123', output: 'clear, 21 C' };
    const reasoning = { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: 'The user wants the weather in Paris; get_weather gives it.' }] };
    const turn = (items) => openai.responses.create({ model: 'oss', tools, max_output_tokens: 1, temperature: 0, input: [{ role: 'user', content: ASK }, ...items, result] });
    const without = await turn([call]), withIt = await turn([reasoning, call]);
    assert.ok(withIt.usage.input_tokens >= without.usage.input_tokens + 12, `${without.usage.input_tokens} -> ${withIt.usage.input_tokens}`);
    const err = await expectError(openai.responses.create({ ...base, model: 'oss', reasoning: { effort: 'minimal' } }), OpenAI.BadRequestError, 400, /gpt-oss's levels/);
    assert.equal(err.param, 'reasoning.effort');
  });
}

async function anthropicChecks(anthropic) {
  const tools = [{ name: 'get_weather', description: 'Weather of a city', input_schema: CITY_SCHEMA }];
  const base = { model: 'oss-tools', messages: [{ role: 'user', content: ASK }], tools, max_tokens: 120, temperature: 1, top_k: 40 };

  await check('messages: tool_choice any and tool give a valid tool_use, streamed as the same; none gives text', async () => {
    for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
      const m = await anthropic.messages.create({ ...base, tool_choice });
      assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
      const uses = m.content.filter((b) => b.type === 'tool_use');
      assert.equal(uses.length, 1);
      assert.ok(City.safeParse(uses[0].input).success, JSON.stringify(uses[0].input));
    }
    const named = { ...base, tool_choice: { type: 'tool', name: 'get_weather' }, temperature: 0 };
    const whole = await anthropic.messages.create(named);
    const streamed = await anthropic.messages.stream(named).finalMessage();
    const noIds = (c) => c.map(({ id, ...rest }) => rest); // ids are fresh per request
    assert.deepEqual(noIds(streamed.content), noIds(whole.content));
    const none = await anthropic.messages.create({ ...base, model: 'oss', tool_choice: { type: 'none' }, max_tokens: 12, temperature: 0 });
    assert.equal(none.content.filter((b) => b.type === 'tool_use').length, 0);
    assert.doesNotMatch(none.content.map((b) => b.text ?? '').join(''), MARKERS);
  });

  await check('messages: the analysis channel is a thinking block, streamed as thinking deltas', async () => {
    const req = { model: 'oss-think', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 120, temperature: 0, thinking: { type: 'enabled', budget_tokens: 1024 } };
    const m = await anthropic.messages.create(req);
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text'], JSON.stringify(m));
    assert.match(m.content[0].thinking, TWO_WORDS);
    assert.match(m.content[1].text, TWO_WORDS);
    let thinking = '';
    const stream = anthropic.messages.stream(req);
    stream.on('thinking', (d) => { thinking += d; });
    const final = await stream.finalMessage();
    assert.equal(thinking, m.content[0].thinking);
    assert.deepEqual(final.content, m.content);
  });

  await check('messages: a thinking block sent back before tool_use is in the next prompt; an unknown effort is a 400', async () => {
    const use = { type: 'tool_use', id: 'call_abc123', name: 'get_weather', input: { city: 'Paris' } };
    const thinking = { type: 'thinking', thinking: 'The user wants the weather in Paris; get_weather gives it.', signature: '' };
    const turn = (blocks) => anthropic.messages.create({
      model: 'oss', tools, max_tokens: 1, temperature: 0,
      messages: [{ role: 'user', content: ASK }, { role: 'assistant', content: blocks },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_abc123', content: 'clear, 21 C' }] }],
    });
    const total = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0);
    const without = await turn([use]), withIt = await turn([thinking, use]);
    assert.ok(total(withIt.usage) >= total(without.usage) + 12, `${total(without.usage)} -> ${total(withIt.usage)}`);
    const err = await expectError(anthropic.messages.create({ ...base, model: 'oss', output_config: { effort: 'max' } }), Anthropic.BadRequestError, 400, /gpt-oss's levels/);
    assert.equal(err.error.error.type, 'invalid_request_error');
  });
}

await run(async () => {
  const model = makeModel();
  const cls = (name, extra) => ({ name, path: model, 'chat-template': TEMPLATE, ctx: 2048, ...extra });
  const config = path.join(TMP, 'config.json');
  writeFileSync(config, JSON.stringify({ models: [cls('oss-tools', { logit_bias: { 64: -50, 276: -50, 3444: -50, 49921: -50, 44803: -50, 35584: -50, 44975: -50 } }), cls('oss-think', { grammar: HARMONY_GBNF })] }));
  // -m takes the third class (NAME=PATH,...): the harness always passes -m
  const srv = await startServer(['--config', config], { model: `oss=${model},chat-template=${TEMPLATE},ctx=2048` });
  const root = `http://127.0.0.1:${srv.port}`;
  const openai = new OpenAI({ baseURL: `${root}/v1`, apiKey: 'none', maxRetries: 0 });
  await chatChecks(openai);
  await responsesChecks(openai);
  await anthropicChecks(new Anthropic({ baseURL: root, apiKey: 'none', maxRetries: 0 }));
});
