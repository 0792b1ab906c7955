// vision_e2e.mjs - images into `kettle serve --mmproj`, through the clients
// agents use: the `openai` package (chat image_url parts, the Responses
// API's input_image), `@anthropic-ai/sdk` (image blocks, and an image in a
// tool_result, where computer-use tools return screenshots) and the Vercel
// AI SDK (image parts).
//
//   node tests/js/vision_e2e.mjs [KETTLE_BIN]      (or env KT_BIN)
//   env KT_SHARED_DIR: the shared folder (default ../shared beside the repository)
//
// The model is golden/arch's random-weight Qwen 3.5 text model with its
// qwen3vl_merger projector: it writes nonsense, so the checks are what
// kettle guarantees whatever the model. The same screenshot and question
// sent through each API give the same prompt token count and the same
// text at temperature 0 as chat completions; the screenshot's 920 tokens
// (a 40 x 23 grid of merged patches) are in the count; sent again, they
// come from the prefix cache and the tower is not run again (/metrics),
// also after a kill -9 and a restart on the same --cache-dir; max_tokens 0
// prefills the prompt and answers nothing;
// an image one pixel apart is encoded anew and shares no block past the
// text before it; a truncated image, an http URL and an image sent to a
// model without a projector are 400s that say why.
// Prints one line per check; exits 0 only if every check passed.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import zlib from 'node:zlib';

import { harness } from './harness.mjs';

let OpenAI, Anthropic, ai, createOpenAICompatible;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ default: Anthropic } = await import('@anthropic-ai/sdk'));
  ai = await import('ai');
  ({ createOpenAICompatible } = await import('@ai-sdk/openai-compatible'));
} catch (e) {
  console.log(`FAIL - setup: cannot load openai, @anthropic-ai/sdk, ai or @ai-sdk/openai-compatible (${e.message}); run: npm ci --prefix tests/js`);
  process.exit(1);
}

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.argv[2] || process.env.KT_BIN;
const SHARED = process.env.KT_SHARED_DIR || path.resolve(HERE, '../../../shared');
const ARCH = path.join(SHARED, 'golden', 'arch');
const MODEL = path.join(ARCH, 'qwen35-F16.gguf');
const MMPROJ = path.join(ARCH, 'mmproj-qwen3vl-F32.gguf');
const STORIES = path.resolve(HERE, '../../models/stories260K.gguf');

const { startServer, stopServer, check, run } = harness({ bin: BIN, model: MODEL, globalTimeoutMs: 280_000 });

const SYSTEM = 'You are a computer-use agent. You see the screen and decide the next action.';
const ASK = 'Find the Settings button in this screenshot and describe what you see around it.';
const SCREENSHOT = readFileSync(path.join(ARCH, 'image-screenshot.png'));
const SCREEN_TOKENS = 40 * 23; // 1280x720 -> a 1280x736 canvas of 32-pixel merged patches
const MAX_TOKENS = 8;

// A PNG of w x h 8-bit RGB pixels (filter 0 rows, zlib), made here so that
// two images can differ by exactly one pixel.
function png(w, h, pixel) {
  const raw = Buffer.alloc((3 * w + 1) * h);
  for (let y = 0; y < h; y++)
    for (let x = 0; x < w; x++) raw.set(pixel(x, y), y * (3 * w + 1) + 1 + 3 * x);
  const chunk = (type, data) => {
    const len = Buffer.alloc(4), crc = Buffer.alloc(4), td = Buffer.concat([Buffer.from(type), data]);
    len.writeUInt32BE(data.length);
    crc.writeUInt32BE(zlib.crc32(td));
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0), ihdr.writeUInt32BE(h, 4), ihdr.set([8, 2, 0, 0, 0], 8);
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk('IHDR', ihdr),
    chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

const dataUrl = (buf, mime = 'image/png') => `data:${mime};base64,${buf.toString('base64')}`;

async function metric(base, name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = new RegExp(`^${name} ([0-9.e+-]+)$`, 'm').exec(text);
  assert.ok(m, `${name} is not in /metrics`);
  return Number(m[1]);
}

async function expectError(promise, status, pattern) {
  let err = null;
  try { await promise; } catch (e) { err = e; }
  assert.ok(err, 'the request succeeded');
  assert.equal(err.status, status, err.message);
  assert.match(err.message, pattern);
}

function chatImage(openai, image, extra = {}) {
  return openai.chat.completions.create({
    model: 'kettle', temperature: 0, max_tokens: MAX_TOKENS, ...extra,
    messages: [{ role: 'system', content: SYSTEM },
      { role: 'user', content: [{ type: 'image_url', image_url: { url: dataUrl(image) } }, { type: 'text', text: ASK }] }],
  });
}

await run(async () => {
  const srv = await startServer(['--mmproj', MMPROJ, '--ctx', '4096', '--parallel', '2']);
  const base = `http://127.0.0.1:${srv.port}`;
  const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 });
  const anthropic = new Anthropic({ baseURL: base, apiKey: 'none', maxRetries: 0 });
  let ref = null;

  await check('chat: a screenshot as an image_url part; its tokens counted; again from the cache, the tower not run', async () => {
    const r = await chatImage(openai, SCREENSHOT);
    ref = { text: r.choices[0].message.content, prompt: r.usage.prompt_tokens };
    assert.ok(ref.prompt > SCREEN_TOKENS + 20 && ref.prompt < SCREEN_TOKENS + 100, `prompt_tokens ${ref.prompt}`);
    assert.equal(r.usage.completion_tokens, MAX_TOKENS);
    const encodes = await metric(base, 'kettle_image_encodes_total');
    const again = await chatImage(openai, SCREENSHOT);
    assert.equal(again.choices[0].message.content, ref.text);
    assert.ok(again.usage.prompt_tokens_details.cached_tokens >= ref.prompt - 16,
      `cached ${again.usage.prompt_tokens_details.cached_tokens} of ${ref.prompt}`);
    assert.equal(await metric(base, 'kettle_image_encodes_total'), encodes);
  });

  await check('chat: an image one pixel apart is encoded anew and shares no block past the text before it', async () => {
    const a = png(320, 200, (x, y) => [x & 255, y & 255, (x ^ y) & 255]);
    const b = png(320, 200, (x, y) => (x === 160 && y === 100 ? [1, 2, 3] : [x & 255, y & 255, (x ^ y) & 255]));
    const ra = await chatImage(openai, a);
    const encodes = await metric(base, 'kettle_image_encodes_total');
    const rb = await chatImage(openai, b);
    assert.equal(await metric(base, 'kettle_image_encodes_total'), encodes + 1);
    assert.equal(rb.usage.prompt_tokens, ra.usage.prompt_tokens);
    const before = ra.usage.prompt_tokens - 10 * 7 - 30; // 320x200 -> 10 x 7 tokens; the text after is ~20
    assert.ok(rb.usage.prompt_tokens_details.cached_tokens <= before,
      `cached ${rb.usage.prompt_tokens_details.cached_tokens} (the image starts near ${before})`);
  });

  await check('messages (@anthropic-ai/sdk): an image block gives chat\'s prompt and text', async () => {
    const r = await anthropic.messages.create({
      model: 'kettle', max_tokens: MAX_TOKENS, temperature: 0, system: SYSTEM,
      messages: [{ role: 'user', content: [
        { type: 'image', source: { type: 'base64', media_type: 'image/png', data: SCREENSHOT.toString('base64') } },
        { type: 'text', text: ASK }] }],
    });
    assert.equal(r.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), ref.text);
    assert.equal(r.usage.input_tokens + (r.usage.cache_read_input_tokens || 0), ref.prompt);
  });

  await check('messages: a screenshot inside a tool_result (computer use) is taken', async () => {
    const tools = [{ name: 'screenshot', description: 'Capture the screen', input_schema: { type: 'object', properties: {} } }];
    const r = await anthropic.messages.create({
      model: 'kettle', max_tokens: MAX_TOKENS, temperature: 0, system: SYSTEM, tools, tool_choice: { type: 'none' },
      messages: [
        { role: 'user', content: ASK },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'call_1', name: 'screenshot', input: {} }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_1', content: [
          { type: 'text', text: 'The screen now:' },
          { type: 'image', source: { type: 'base64', media_type: 'image/png', data: SCREENSHOT.toString('base64') } }] }] },
      ],
    });
    const prompt = r.usage.input_tokens + (r.usage.cache_read_input_tokens || 0);
    assert.ok(prompt > SCREEN_TOKENS + 20, `input tokens ${prompt}`);
  });

  await check('responses (openai): input_image gives chat\'s text', async () => {
    const r = await openai.responses.create({
      model: 'kettle', temperature: 0, max_output_tokens: MAX_TOKENS, instructions: SYSTEM,
      input: [{ role: 'user', content: [{ type: 'input_image', image_url: dataUrl(SCREENSHOT) }, { type: 'input_text', text: ASK }] }],
    });
    assert.equal(r.output_text, ref.text);
    assert.equal(r.usage.input_tokens, ref.prompt);
  });

  await check('Vercel AI SDK: an image part gives chat\'s text', async () => {
    const provider = createOpenAICompatible({ name: 'kettle', baseURL: `${base}/v1`, apiKey: 'none' });
    const r = await ai.generateText({
      model: provider('kettle'), temperature: 0, maxOutputTokens: MAX_TOKENS, maxRetries: 0, system: SYSTEM,
      messages: [{ role: 'user', content: [{ type: 'image', image: SCREENSHOT, mediaType: 'image/png' }, { type: 'text', text: ASK }] }],
    });
    assert.equal(r.text, ref.text);
    assert.equal(r.usage.inputTokens, ref.prompt);
  });

  await check('bad images are 400s that say why', async () => {
    await expectError(chatImage(openai, SCREENSHOT.subarray(0, 2000)), 400, /image 0/);
    await expectError(openai.chat.completions.create({ model: 'kettle', max_tokens: 4, messages: [{ role: 'user', content: [
      { type: 'image_url', image_url: { url: 'https://example.com/a.png' } }] }] }), 400, /data: URL/);
    await expectError(chatImage(openai, Buffer.from('GIF89a not an image at all')), 400, /PNG, JPEG or WebP/);
  });

  await check('max_tokens 0 prefills; the screenshot\'s KV survives a kill -9 in --cache-dir, the tower not run again', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'kettle-vision-'));
    try {
      const args = ['--mmproj', MMPROJ, '--ctx', '4096', '--parallel', '2', '--cache-dir', dir];
      let s = await startServer(args);
      let o = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'none', maxRetries: 0 });
      const pre = await chatImage(o, SCREENSHOT, { max_tokens: 0 });
      assert.equal(pre.choices[0].message.content, '');
      assert.equal(pre.choices[0].finish_reason, 'length');
      assert.equal(pre.usage.completion_tokens, 0);
      assert.equal(pre.usage.prompt_tokens, ref.prompt);
      const after = await chatImage(o, SCREENSHOT);
      assert.equal(after.choices[0].message.content, ref.text);
      assert.ok(after.usage.prompt_tokens_details.cached_tokens >= ref.prompt - 16);
      // the disk tier writes behind the requests: kill once it has gone quiet
      const base1 = `http://127.0.0.1:${s.port}`;
      let writes = -1, same = 0;
      for (let t = 0; t < 200 && same < 5; t++) {
        await new Promise((r) => setTimeout(r, 100));
        const w = await metric(base1, 'kettle_cache_disk_writes_total');
        same = w > 0 && w === writes ? same + 1 : 0, writes = w;
      }
      assert.ok(same >= 5, 'the disk tier did not go quiet in 20 s');
      s.proc.kill('SIGKILL');
      await s.exitedPromise;
      s = await startServer(args);
      o = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'none', maxRetries: 0 });
      const back = await chatImage(o, SCREENSHOT);
      assert.equal(back.choices[0].message.content, ref.text);
      assert.ok(back.usage.prompt_tokens_details.cached_tokens >= SCREEN_TOKENS,
        `cached after the restart: ${back.usage.prompt_tokens_details.cached_tokens}`);
      assert.equal(await metric(`http://127.0.0.1:${s.port}`, 'kettle_image_encodes_total'), 0);
      await stopServer(s);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  const plain = await startServer([], { model: STORIES });
  await check('a model without a projector says to start kettle with --mmproj', async () => {
    const o = new OpenAI({ baseURL: `http://127.0.0.1:${plain.port}/v1`, apiKey: 'none', maxRetries: 0 });
    await expectError(chatImage(o, SCREENSHOT), 400, /--mmproj/);
  });
});
