// tools_e2e.mjs - tool calls through `kettle serve` with the clients agents
// use: the official `openai` package, the Vercel AI SDK (`ai` with
// `@ai-sdk/openai-compatible`, generateText over several steps) and the
// OpenAI Agents SDK (`@openai/agents`, its chat-completions model).
//
//   node tests/js/tools_e2e.mjs [KETTLE_BIN]      (or env KT_BIN)
//   env KT_SHARED_DIR: the shared folder (default ../shared beside the repository)
//
// The models are random-weight test-tiny files of real vocabularies
// (`kettle gen-model`) served with real templates of two families: Qwen 2.5
// (Hermes `<tool_call>` JSON) and Llama 3.1 (bare JSON, `<|python_tag|>`).
// Such a model writes nothing sensible, so what is checked is what kettle
// guarantees whatever the model: under tool_choice "required" or a named
// function the SDK gets calls whose arguments the zod schema accepts and
// finish_reason "tool_calls"; "none" gives none; a stream put together by
// the SDK equals the whole answer; a tool's result sent back is answered;
// each SDK completes its loop (the tool really runs, a final answer comes
// back); and a tool_choice kettle does not know is a 400 the SDK raises.
// Prints one line per check; exits 0 only if every check passed.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { harness } from './harness.mjs';

let OpenAI, ai, createOpenAICompatible, z, agents;
try {
  ({ default: OpenAI } = await import('openai'));
  ai = await import('ai');
  ({ createOpenAICompatible } = await import('@ai-sdk/openai-compatible'));
  ({ z } = await import('zod'));
  agents = await import('@openai/agents');
} catch (e) {
  console.log(`FAIL - setup: cannot load openai, ai, @ai-sdk/openai-compatible, zod or @openai/agents (${e.message}); run: npm ci --prefix tests/js`);
  process.exit(1);
}
globalThis.AI_SDK_LOG_WARNINGS = false;

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.argv[2] || process.env.KT_BIN;
const SHARED = process.env.KT_SHARED_DIR || path.resolve(HERE, '../../../shared');
const TMP = mkdtempSync(path.join(os.tmpdir(), 'kettle-tools-'));
process.on('exit', () => rmSync(TMP, { recursive: true, force: true }));

const { startServer, check, run } = harness({ bin: BIN, model: '', globalTimeoutMs: 240_000 });

// Small on purpose (an enum, a bounded integer, no other keys) so that a
// random model closes its arguments within a few dozen tokens.
const CITIES = ['Paris', 'Oslo', 'Lima'];
const Weather = z.object({ city: z.enum(CITIES), days: z.number().int().min(1).max(7).optional() }).strict();
const WEATHER_SCHEMA = z.toJSONSchema(Weather);
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: WEATHER_SCHEMA } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {}, additionalProperties: false } } },
];
const ASK = [{ role: 'user', content: 'What is the weather in Paris?' }];

function assertCall(call, where) {
  assert.equal(call.type, 'function', `${where}: type`);
  assert.ok(typeof call.id === 'string' && call.id.length >= 9, `${where}: id ${call.id}`);
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') {
    const ok = Weather.safeParse(args);
    assert.ok(ok.success, `${where}: arguments ${call.function.arguments}: ${ok.error?.message}`);
  } else {
    assert.equal(call.function.name, 'get_time', `${where}: a function that was not offered`);
    assert.deepEqual(args, {}, `${where}: get_time takes nothing`);
  }
}

function makeModel(vocab) {
  const out = path.join(TMP, vocab);
  execFileSync(BIN, ['gen-model', '--shape', 'test-tiny', '--type', 'Q8_0', '--vocab', path.join(SHARED, 'vocab', vocab), '-o', out]);
  return out;
}

async function openaiChecks(family, client) {
  const base = { model: 'kettle', messages: ASK, tools: TOOLS, max_tokens: 200 };

  await check(`${family}: openai, tool_choice required gives valid calls`, async () => {
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.create({ ...base, tool_choice: 'required', temperature: 1, seed, parallel_tool_calls: false });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
      assert.equal(c.message.content, null);
      assert.equal(c.message.tool_calls.length, 1);
      assertCall(c.message.tool_calls[0], `seed ${seed}`);
    }
  });

  await check(`${family}: openai, a named function and "none"`, async () => {
    const r = await client.chat.completions.create({ ...base, tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 1, seed: 4 });
    const calls = r.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'get_weather');
    assertCall(calls[0], 'named');
    const n = await client.chat.completions.create({ ...base, tool_choice: 'none', max_tokens: 16, temperature: 0 });
    assert.equal(n.choices[0].message.tool_calls, undefined);
    assert.equal(typeof n.choices[0].message.content, 'string');
    assert.notEqual(n.choices[0].finish_reason, 'tool_calls');
  });

  await check(`${family}: openai, a streamed call equals the whole one`, async () => {
    const req = { ...base, tool_choice: 'required', temperature: 0, parallel_tool_calls: false };
    const whole = await client.chat.completions.create(req);
    const stream = await client.chat.completions.create({ ...req, stream: true });
    const calls = [];
    let finishes = 0;
    let finish = null;
    for await (const chunk of stream) {
      const ch = chunk.choices[0];
      if (!ch) continue;
      if (ch.finish_reason) finishes++, (finish = ch.finish_reason);
      assert.ok(!ch.delta.content || !/<tool_call|python_tag/.test(ch.delta.content), `marker in content: ${ch.delta.content}`);
      for (const tc of ch.delta.tool_calls || []) {
        if (tc.id) {
          assert.equal(calls[tc.index], undefined, `call ${tc.index} announced twice`);
          calls[tc.index] = { id: tc.id, name: tc.function.name, args: tc.function.arguments || '' };
        } else {
          assert.ok(calls[tc.index], `arguments before the call's id`);
          assert.equal(tc.function.name, undefined, 'the name sent twice');
          calls[tc.index].args += tc.function.arguments || '';
        }
      }
    }
    assert.equal(finishes, 1);
    assert.equal(finish, 'tool_calls');
    const want = whole.choices[0].message.tool_calls;
    assert.equal(calls.length, want.length);
    calls.forEach((c, i) => {
      assert.equal(c.name, want[i].function.name);
      assert.equal(c.args, want[i].function.arguments);
    });
  });

  await check(`${family}: openai, the tool's result gets an answer`, async () => {
    const first = await client.chat.completions.create({ ...base, tool_choice: 'required', temperature: 1, seed: 5, parallel_tool_calls: false });
    const msg = first.choices[0].message;
    const messages = [...ASK, msg, { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '{"temp_c": 21, "sky": "clear"}' }];
    const second = await client.chat.completions.create({ model: 'kettle', messages, tools: TOOLS, max_tokens: 12, temperature: 0 });
    assert.equal(typeof second.choices[0].message.content, 'string');
    assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens, 'the second turn holds the first');
  });

  await check(`${family}: openai, an unknown tool_choice is a 400`, async () => {
    await assert.rejects(client.chat.completions.create({ ...base, tool_choice: 'banana' }), (e) => {
      assert.equal(e.status, 400);
      assert.match(e.message, /banana/);
      return true;
    });
  });
}

async function aiSdkCheck(family, baseURL) {
  await check(`${family}: Vercel AI SDK, generateText runs the tool and answers`, async () => {
    const provider = createOpenAICompatible({ name: 'kettle', baseURL, apiKey: 'none' });
    const ran = [];
    const result = await ai.generateText({
      model: provider('kettle'),
      prompt: 'What is the weather in Paris?',
      tools: {
        get_weather: ai.tool({ description: 'Weather of a city', inputSchema: Weather, execute: async (input) => (ran.push(input), { temp_c: 21 }) }),
      },
      // the first step must call, the second must answer in text
      prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
      stopWhen: ai.stepCountIs(3),
      maxOutputTokens: 300,
      temperature: 1,
      seed: 6,
      // request fields the SDK has no option for go through providerOptions
      providerOptions: { kettle: { parallel_tool_calls: false } },
    });
    assert.equal(result.steps.length, 2, `steps: ${result.steps.map((s) => s.finishReason)}`);
    assert.equal(result.steps[0].finishReason, 'tool-calls');
    assert.ok(result.steps[0].toolCalls.length >= 1);
    assert.ok(ran.length >= 1, 'the tool ran');
    for (const input of ran) assert.ok(Weather.safeParse(input).success, JSON.stringify(input));
    assert.equal(result.steps[0].toolResults.length, result.steps[0].toolCalls.length);
    assert.equal(typeof result.text, 'string');
  });
}

async function agentsSdkCheck(family, baseURL) {
  await check(`${family}: OpenAI Agents SDK, the agent calls its tool and finishes`, async () => {
    const { Agent, run: runAgent, tool, OpenAIChatCompletionsModel, setTracingDisabled } = agents;
    setTracingDisabled(true);
    const client = new OpenAI({ baseURL, apiKey: 'none' });
    const ran = [];
    // the SDK sends an optional field as required-or-null and drops
    // integer bounds from its JSON Schema, then validates with the zod
    // schema: a city alone keeps the two the same
    const City = z.object({ city: z.enum(CITIES) }).strict();
    const getWeather = tool({
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: City,
      execute: async (input) => (ran.push(input), 'clear, 21 C'),
    });
    const agent = new Agent({
      name: 'weather',
      instructions: 'Answer with the weather.',
      tools: [getWeather],
      model: new OpenAIChatCompletionsModel(client, 'kettle'),
      // required on the first turn; the SDK resets tool_choice after a call
      modelSettings: { toolChoice: 'required', temperature: 1, maxTokens: 300, parallelToolCalls: false },
    });
    const result = await runAgent(agent, 'What is the weather in Paris?', { maxTurns: 4 });
    assert.ok(ran.length >= 1, 'the tool ran');
    for (const input of ran) assert.ok(City.safeParse(input).success, JSON.stringify(input));
    assert.equal(typeof result.finalOutput, 'string');
  });
}

await run(async () => {
  const families = [
    ['hermes (Qwen 2.5)', 'ggml-vocab-qwen2.gguf', 'templates/Qwen-Qwen2.5-7B-Instruct.jinja'],
    ['llama3 (Llama 3.1)', 'ggml-vocab-llama-bpe.gguf', 'templates/meta-llama-Llama-3.1-8B-Instruct.jinja'],
  ];
  for (const [family, vocab, template] of families) {
    const srv = await startServer(['--alias', 'kettle', '--ctx', '2048', '--chat-template', path.join(SHARED, template)], { model: makeModel(vocab) });
    const baseURL = `http://127.0.0.1:${srv.port}/v1`;
    await openaiChecks(family, new OpenAI({ baseURL, apiKey: 'none' }));
    await aiSdkCheck(family, baseURL);
    await agentsSdkCheck(family, baseURL);
  }
});
