// ai_sdk_e2e.mjs - `kettle serve` driven by the Vercel AI SDK (`ai`, with
// `@ai-sdk/openai-compatible` and a `zod` schema).
//
//   node tests/js/ai_sdk_e2e.mjs [KETTLE_BIN]      (or env KT_BIN)
//   the model: the repository's models/stories260K.gguf
//
// Starts `kettle serve` on stories260K on a free loopback port (--port 0,
// the port read from its "listening on" line). stories260K does not follow
// instructions, so only the grammar kettle builds from the schema can make
// its answers valid. Checks that generateObject sends the zod schema as
// response_format json_schema (the body on the wire is read back) and returns
// an object the same zod schema accepts, with the enums, booleans, integer
// ranges and string lengths it asks for; that the SDK raises an APICallError
// with status 400 naming the keyword when the schema holds something kettle
// cannot enforce (a lookahead pattern, multipleOf), so a schema is never
// silently ignored; and that streamObject yields growing partial objects and
// a final one the zod schema accepts, equal to generateObject's for the same
// seed. Sampling is at temperature 1 with fixed seeds; an answer cut by
// max_tokens (the SDK's NoObjectGeneratedError, finish reason 'length') moves
// on to the next seed, a bounded number of times, and is never counted as
// valid. Prints one line per check; exits 0 only if every check passed. The
// server is always stopped (also on failure, and by a global timeout), so no
// server outlives the test.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { harness } from './harness.mjs';

// Loaded here rather than by static imports so that a missing package fails
// with a message that says what to run.
let ai, createOpenAICompatible, z;
try {
  ai = await import('ai');
  ({ createOpenAICompatible } = await import('@ai-sdk/openai-compatible'));
  ({ z } = await import('zod'));
} catch (e) {
  console.log(`FAIL - setup: cannot load the ai, @ai-sdk/openai-compatible or zod package (${e.message}); run: npm ci --prefix tests/js`);
  process.exit(1);
}
const { generateObject, streamObject, asSchema, APICallError, NoObjectGeneratedError } = ai;
globalThis.AI_SDK_LOG_WARNINGS = false; // warnings are checked, not printed

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.argv[2] || process.env.KT_BIN;
const MODEL = path.resolve(HERE, '../../models/stories260K.gguf'); // shipped in the repository
const MAX_SEEDS = 8; // seeds tried per check before an unfinished object fails it
const MAX_OUTPUT_TOKENS = 256; // the Pet objects of seeds 1..40 take 101..154 tokens
const GLOBAL_TIMEOUT_MS = 90_000;

const { startServer, stopServer, check, run } = harness({ bin: BIN, model: MODEL, pass: 'PASS', globalTimeoutMs: GLOBAL_TIMEOUT_MS });

// The schema of every generation: small on purpose (enums, booleans, small
// bounded integers, short strings, one nested object), so that a random-ish
// model closes the object well within MAX_OUTPUT_TOKENS.
const ANIMALS = ['cat', 'dog', 'bird'];
const COLORS = ['red', 'green', 'blue'];
const Pet = z.object({
  animal: z.enum(ANIMALS),
  happy: z.boolean(),
  age: z.number().int().min(1).max(12),
  name: z.string().min(1).max(10),
  toy: z.object({
    color: z.enum(COLORS),
    count: z.number().int().min(0).max(3),
  }),
});
const KEYS = ['age', 'animal', 'happy', 'name', 'toy'];

// The zod checks again by hand, so a lax zod or SDK cannot hide a bad answer.
function assertPet(v, where) {
  const again = Pet.safeParse(v);
  assert.ok(again.success, `${where}: the zod schema refuses ${JSON.stringify(v)}: ${again.error?.message}`);
  assert.deepEqual(Object.keys(v).sort(), KEYS, `${where}: keys of ${JSON.stringify(v)}`);
  assert.ok(ANIMALS.includes(v.animal), `${where}: animal ${JSON.stringify(v.animal)}`);
  assert.equal(typeof v.happy, 'boolean', `${where}: happy ${JSON.stringify(v.happy)}`);
  assert.ok(Number.isInteger(v.age) && v.age >= 1 && v.age <= 12, `${where}: age ${JSON.stringify(v.age)}`);
  assert.ok(typeof v.name === 'string' && v.name.length >= 1 && v.name.length <= 10, `${where}: name ${JSON.stringify(v.name)}`);
  assert.deepEqual(Object.keys(v.toy).sort(), ['color', 'count'], `${where}: toy ${JSON.stringify(v.toy)}`);
  assert.ok(COLORS.includes(v.toy.color), `${where}: toy.color ${JSON.stringify(v.toy.color)}`);
  assert.ok(Number.isInteger(v.toy.count) && v.toy.count >= 0 && v.toy.count <= 3, `${where}: toy.count ${JSON.stringify(v.toy.count)}`);
}

// True if the error is the SDK's "the answer was cut by max_tokens".
const cutByLength = (e) => NoObjectGeneratedError.isInstance(e) && e.finishReason === 'length';

const PROMPT = 'Describe a pet as JSON.';

async function main() {
  if (!BIN) throw new Error('usage: node ai_sdk_e2e.mjs KETTLE_BIN (or set KT_BIN)');
  if (!existsSync(BIN)) throw new Error(`no kettle binary at ${BIN}`);
  if (!existsSync(MODEL)) throw new Error(`no model at ${MODEL} (the repository ships it: models/README.md)`);

  const srv = await startServer();
  const root = `http://127.0.0.1:${srv.port}`;
  console.log(`# kettle serve on port ${srv.port}`);

  // Every request body the SDK sends, as it went on the wire.
  const sent = [];
  const recordingFetch = (url, init) => {
    if (init?.body) sent.push({ url: String(url), body: JSON.parse(init.body) });
    return fetch(url, init);
  };
  // Without supportsStructuredOutputs the provider sends only
  // {type: 'json_object'} and drops the schema (with a warning).
  const kettle = createOpenAICompatible({
    name: 'kettle', baseURL: `${root}/v1`, apiKey: 'x',
    supportsStructuredOutputs: true, includeUsage: true, fetch: recordingFetch,
  });
  const model = kettle.chatModel(path.basename(MODEL));
  const settings = { model, prompt: PROMPT, maxOutputTokens: MAX_OUTPUT_TOKENS, temperature: 1, maxRetries: 0 };
  const wantSchema = await asSchema(Pet).jsonSchema;
  let generated = null; // {seed, object} of the generateObject check

  await check('generateObject: the zod schema goes out as response_format json_schema; the object is valid', async () => {
    let tries = 0;
    let r = null;
    let seed = 0;
    while (!r && seed < MAX_SEEDS) {
      tries++;
      seed++;
      const before = sent.length;
      try {
        r = await generateObject({ ...settings, schema: Pet, seed });
      } catch (e) {
        if (!cutByLength(e)) throw e;
      }
      assert.equal(sent.length, before + 1, 'the SDK sent no request (or several)');
      const body = sent[before].body;
      assert.ok(sent[before].url.endsWith('/v1/chat/completions'), sent[before].url);
      assert.equal(body.seed, seed);
      assert.equal(body.max_tokens, MAX_OUTPUT_TOKENS);
      assert.equal(body.response_format?.type, 'json_schema', `response_format ${JSON.stringify(body.response_format)}`);
      assert.deepEqual(body.response_format.json_schema.schema, wantSchema);
    }
    assert.ok(r, `all ${MAX_SEEDS} seeds hit max_tokens (${MAX_OUTPUT_TOKENS}) before the object closed`);
    assert.equal(r.finishReason, 'stop');
    assert.deepEqual(r.warnings ?? [], [], `warnings ${JSON.stringify(r.warnings)}`);
    assert.ok(r.usage.outputTokens > 0 && r.usage.inputTokens > 0, `usage ${JSON.stringify(r.usage)}`);
    assertPet(r.object, 'generateObject');
    generated = { seed, object: r.object };
    console.log(`# generateObject: ${tries} seed(s) tried; ${JSON.stringify(r.object)}`);
  });

  await check('generateObject: a schema kettle cannot enforce is an APICallError 400 naming the keyword', async () => {
    const refused = [
      // lookahead is outside kettle's regex subset
      { schema: z.object({ code: z.string().regex(/^(?=a)[a-z]$/) }), want: [/pattern/, /lookaround/] },
      { schema: z.object({ even: z.number().int().min(0).max(8).multipleOf(2) }), want: [/multipleOf/] },
    ];
    for (const { schema, want } of refused) {
      const before = sent.length;
      await assert.rejects(generateObject({ ...settings, schema, seed: 1 }), (e) => {
        assert.ok(APICallError.isInstance(e), `not an APICallError: ${e}`);
        assert.equal(e.statusCode, 400, `status ${e.statusCode}: ${e.message}`);
        for (const re of want) assert.match(e.message, re);
        assert.equal(e.isRetryable, false);
        return true;
      });
      assert.equal(sent.length, before + 1);
      assert.deepEqual(sent[before].body.response_format.json_schema.schema, await asSchema(schema).jsonSchema);
    }
  });

  await check('streamObject: partial objects grow into a final object that is valid', async () => {
    let tries = 0;
    let done = null;
    for (let seed = 1; seed <= MAX_SEEDS && !done; seed++) {
      tries++;
      const before = sent.length;
      const streamErrors = [];
      const r = streamObject({ ...settings, schema: Pet, seed, onError: ({ error }) => streamErrors.push(error) });
      const partials = [];
      for await (const p of r.partialObjectStream) partials.push(structuredClone(p));
      let object;
      try {
        object = await r.object;
      } catch (e) {
        if (!cutByLength(e)) throw e;
        continue;
      }
      assert.deepEqual(streamErrors, []);
      const body = sent[before].body;
      assert.equal(body.stream, true);
      assert.equal(body.seed, seed);
      assert.equal(body.response_format?.type, 'json_schema');
      assert.deepEqual(body.response_format.json_schema.schema, wantSchema);
      done = { seed, object, partials, finishReason: await r.finishReason, usage: await r.usage, warnings: await r.warnings };
    }
    assert.ok(done, `all ${MAX_SEEDS} seeds hit max_tokens (${MAX_OUTPUT_TOKENS}) before the object closed`);
    const { object, partials } = done;
    assert.equal(done.finishReason, 'stop');
    assert.deepEqual(done.warnings ?? [], []);
    assert.ok(done.usage.outputTokens > 0, `usage ${JSON.stringify(done.usage)} (stream_options.include_usage)`);
    assertPet(object, 'streamObject');
    assert.ok(partials.length >= 3, `only ${partials.length} partial objects: ${JSON.stringify(partials)}`);
    assert.deepEqual(partials.at(-1), object, 'the last partial object is not the final object');
    // each partial is an object with known keys only, and has no fewer keys than the one before
    let nKeys = 0;
    for (const p of partials) {
      assert.equal(typeof p, 'object', JSON.stringify(p));
      for (const k of Object.keys(p)) assert.ok(KEYS.includes(k), `unknown key ${k} in ${JSON.stringify(p)}`);
      assert.ok(Object.keys(p).length >= nKeys, `a partial lost keys: ${JSON.stringify(partials)}`);
      nKeys = Object.keys(p).length;
      if (p.animal !== undefined) assert.ok(ANIMALS.some((a) => a.startsWith(p.animal)), `animal ${JSON.stringify(p.animal)}`);
    }
    // the same seed gives the same object, streamed or not
    if (generated?.seed === done.seed) assert.deepEqual(object, generated.object, 'streamed and non-streamed objects of one seed differ');
    assert.ok(Object.keys(partials[0]).length < KEYS.length, `the first partial is already whole: ${JSON.stringify(partials[0])}`);
    console.log(`# streamObject: ${tries} seed(s) tried; ${partials.length} partial objects; ${JSON.stringify(object)}`);
  });

  await check('SIGTERM shuts the server down cleanly (exit 0)', async () => {
    const { code, signal } = await stopServer(srv);
    assert.equal(signal, null, `killed by ${signal}; log:\n${srv.stderr}`);
    assert.equal(code, 0, `exit code ${code}; log:\n${srv.stderr}`);
  });
}

await run(main);
