// webui_e2e.mjs - the chat page of `kettle serve` (GET /) in headless
// Chromium, driven by puppeteer-core (which downloads no browser: Debian's
// /usr/bin/chromium, installed by scripts/deps.sh).
//
//   node tests/js/webui_e2e.mjs [KETTLE_BIN]      (or env KT_BIN)
//   the model: the repository's models/stories260K.gguf
//   env KETTLE_CHROMIUM: another browser binary (default /usr/bin/chromium)
//   env KETTLE_WEBUI_SCREENSHOT=PATH: also write the screenshot there
//       (docs/webui.png is made so); without it nothing is written
//
// One `kettle serve --api-key` on stories260K. The page loads without the
// key and shows the API's 401 in the conversation; with the key typed into
// its settings the model picker lists the served model; at temperature 0 a
// streamed answer equals a direct non-streaming request with the same
// messages; each reply shows TTFT, tokens/s and cached tokens, and the
// second turn's prompt comes from the prefix cache; Stop ends a long reply
// before it finishes and the server cancels it; a wrong key's error is shown
// on the reply. The browser and the server are always stopped (on failure,
// on a signal, and by the harness's global timeout).
import assert from 'node:assert/strict';
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { harness } from './harness.mjs';

let puppeteer;
try {
  ({ default: puppeteer } = await import('puppeteer-core'));
} catch (e) {
  console.log(`FAIL - setup: cannot load puppeteer-core (${e.message}); run: npm ci --prefix tests/js`);
  process.exit(1);
}

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.argv[2] || process.env.KT_BIN;
const MODEL = path.resolve(HERE, '../../models/stories260K.gguf'); // shipped in the repository
const CHROMIUM = process.env.KETTLE_CHROMIUM || '/usr/bin/chromium';
const IMAGE = path.resolve(HERE, '../../docs/webui.png'); // any PNG of the repository
const KEY = 'webui-test-key';
const N = 24;         // max_tokens of the compared answers
const LONG = 1500;    // max_tokens of the reply that is stopped (ctx 2048, with the history)
const STEP_MS = 20_000; // the most one page step may wait (a busy machine under the sanitizers)

const { startServer, check, run } = harness({ bin: BIN, model: MODEL, pass: 'ok', globalTimeoutMs: 110_000 }); // under ctest's 120 s

let browser = null;
// the harness's exit paths kill servers; the browser is a child too
process.on('exit', () => { try { browser?.process()?.kill('SIGKILL'); } catch { /* gone */ } });

async function metric(root, name) {
  const text = await (await fetch(`${root}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } })).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? NaN : Number(line.slice(name.length + 1));
}

// A settings field set as a user would: cleared, typed, then left (change).
async function setField(page, id, value) {
  await page.click(`#${id}`, { count: 3 });
  await page.$eval(`#${id}`, (e) => { e.value = ''; });
  await page.type(`#${id}`, value);
  await page.$eval(`#${id}`, (e) => e.dispatchEvent(new Event('change')));
}

// Types a message, sends it with Enter, and waits until that reply (the
// n-th assistant message, 1-based) is no longer streaming; returns what the
// page shows of it.
async function sendAndWait(page, text, n) {
  await page.type('#input', text);
  await page.keyboard.press('Enter');
  await page.waitForFunction((k) => {
    const m = document.querySelectorAll('.msg.assistant')[k - 1];
    return m && m.dataset.state !== 'streaming';
  }, { timeout: STEP_MS, polling: 'mutation' }, n);
  return lastReply(page);
}

function lastReply(page) {
  return page.evaluate(() => {
    const all = document.querySelectorAll('.msg.assistant');
    const m = all[all.length - 1];
    const stats = m.querySelector('.stats');
    return {
      state: m.dataset.state,
      text: m.querySelector('.content').textContent,
      error: m.querySelector('.error-box')?.textContent ?? null,
      stats: stats ? { ...stats.dataset } : {},
      statsText: stats ? stats.textContent : '',
    };
  });
}

// Events as a server streams them, ending with [DONE].
function sse(events) {
  return events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join('') + 'data: [DONE]\n\n';
}

// The same conversation without the page: non-streaming, same settings.
async function direct(root, model, messages) {
  const res = await fetch(`${root}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model, messages, temperature: 0, max_tokens: N }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  return (await res.json()).choices[0].message.content;
}

async function main() {
  if (!BIN) throw new Error('usage: node webui_e2e.mjs KETTLE_BIN (or set KT_BIN)');
  if (!existsSync(BIN)) throw new Error(`no kettle binary at ${BIN}`);
  if (!existsSync(MODEL)) throw new Error(`no model at ${MODEL} (the repository ships it: models/README.md)`);
  if (!existsSync(CHROMIUM)) throw new Error(`no browser at ${CHROMIUM}: run scripts/deps.sh (Debian's chromium)`);

  const srv = await startServer(['--api-key', KEY]);
  const root = `http://127.0.0.1:${srv.port}`;
  const model = path.basename(MODEL);
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
    timeout: 60_000, // a first start on a busy machine (ctest -j2) has taken over 20 s
  });
  try {
    await session(browser, root, model);
  } finally {
    await browser.close().catch(() => browser.process()?.kill('SIGKILL'));
    browser = null;
  }
}

async function session(browser, root, model) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1200, height: 820 });
  page.setDefaultTimeout(STEP_MS);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  // anything the Content-Security-Policy blocked (an inline style or script
  // would be), counted from before the page's own script runs
  await page.evaluateOnNewDocument(() => {
    window.cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) => window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));
  });

  await check('GET / serves the page with a strict CSP, without the API key', async () => {
    const res = await page.goto(`${root}/`, { waitUntil: 'load' });
    assert.equal(res.status(), 200);
    const h = res.headers();
    assert.equal(h['content-type'], 'text/html; charset=utf-8');
    assert.match(h['content-security-policy'], /^default-src 'self';/);
    assert.ok(h['cache-control'], 'no Cache-Control');
    assert.equal(await page.title(), 'kettle');
  });

  await check('without the key, the model list\'s 401 is shown in the conversation', async () => {
    await page.waitForSelector('.msg.system .error-box');
    const text = await page.$eval('.msg.system .error-box', (e) => e.textContent);
    assert.match(text, /HTTP 401: missing or wrong API key/);
  });

  await check('with the key in the settings, the model picker lists the served model', async () => {
    await setField(page, 'api_key', KEY);
    await page.waitForFunction(() => document.getElementById('model').dataset.loaded === 'true');
    const ids = await page.$$eval('#model option', (os) => os.map((o) => o.value));
    assert.deepEqual(ids, [model]);
  });

  await page.click('#new-chat');
  await setField(page, 'temperature', '0');
  await setField(page, 'max_tokens', String(N));
  const q1 = 'Tell me a story about a cat.';
  const q2 = 'And what did the cat do next?';
  let first = null;

  await check('a streamed answer equals the direct non-streaming answer (temperature 0)', async () => {
    first = await sendAndWait(page, q1, 1);
    assert.equal(first.state, 'done', JSON.stringify(first));
    assert.ok(first.text.length > 0, 'no text');
    const want = await direct(root, model, [{ role: 'user', content: q1 }]);
    assert.equal(first.text, want);
  });

  await check('the reply shows TTFT, tokens/s and cached/prompt tokens', async () => {
    assert.ok(first, 'no first reply');
    const s = first.stats;
    const ttft = Number(s.ttftMs);
    const tps = Number(s.tps);
    assert.ok(ttft > 0 && ttft < STEP_MS, `TTFT ${s.ttftMs}`);
    assert.ok(tps > 0 && tps < 1e7, `tok/s ${s.tps}`);
    assert.equal(Number(s.completionTokens), N);
    assert.ok(Number(s.prompt) > 0, `prompt ${s.prompt}`);
    assert.ok(Number(s.cached) >= 0 && Number(s.cached) < Number(s.prompt), `cached ${s.cached}`);
    assert.match(first.statsText, /TTFT [\d.]+ ms/);
    assert.match(first.statsText, /[\d.]+ tok\/s/);
    assert.match(first.statsText, new RegExp(`cached ${s.cached}/${s.prompt} prompt tokens`));
  });

  let shot = null;
  await check('the second turn continues the conversation, its prompt from the prefix cache', async () => {
    const second = await sendAndWait(page, q2, 2);
    assert.equal(second.state, 'done', JSON.stringify(second));
    assert.ok(Number(second.stats.cached) > 0, `cached ${second.stats.cached}`);
    assert.ok(Number(second.stats.prompt) > Number(first?.stats.prompt), 'the history was not sent');
    const want = await direct(root, model, [
      { role: 'user', content: q1 }, { role: 'assistant', content: first.text }, { role: 'user', content: q2 },
    ]);
    assert.equal(second.text, want);
    shot = await page.screenshot({ type: 'png' });
  });

  await check('the screenshot is a PNG of the page (written only if KETTLE_WEBUI_SCREENSHOT is set)', async () => {
    assert.ok(shot, 'no screenshot');
    const b = Buffer.from(shot);
    assert.ok(b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'not a PNG');
    assert.equal(b.readUInt32BE(16), 1200); // IHDR width, height
    assert.equal(b.readUInt32BE(20), 820);
    assert.ok(b.length > 20_000, `only ${b.length} bytes: a blank page?`);
    const out = process.env.KETTLE_WEBUI_SCREENSHOT;
    if (out) {
      writeFileSync(out, b);
      console.log(`# screenshot written to ${out}`);
    }
  });

  await check('Stop ends a long reply before it finishes; the server cancels it', async () => {
    const cancelled = 'kettle_requests_finished_total{reason="cancelled"}';
    const before = (await metric(root, cancelled)) || 0;
    await setField(page, 'max_tokens', String(LONG));
    // stories260K writes 1500 tokens in about half a second, quicker than a
    // round trip through the DevTools protocol is sure to be: so Stop is
    // clicked from inside the page, the moment the first text shows
    await page.evaluate(() => {
      const box = document.getElementById('messages');
      const obs = new MutationObserver(() => {
        const all = box.querySelectorAll('.msg.assistant');
        const m = all[all.length - 1];
        if (m && m.dataset.state === 'streaming' && m.querySelector('.content').textContent) {
          obs.disconnect();
          document.getElementById('stop').click();
        }
      });
      obs.observe(box, { childList: true, subtree: true, characterData: true });
    });
    const r = await sendAndWait(page, 'Tell me a very long story.', 3);
    assert.equal(r.state, 'stopped', JSON.stringify(r));
    assert.match(r.statsText, /stopped/);
    assert.ok(r.text.length > 0);
    assert.equal(await page.$eval('#stop', (e) => e.hidden), true, 'Stop still shown');
    assert.equal(await page.$eval('#send', (e) => e.hidden), false, 'Send not back');
    let after = before;
    for (let i = 0; i < 100 && after <= before; i++) { // up to 5 s
      after = await metric(root, cancelled);
      if (after <= before) await new Promise((res) => setTimeout(res, 50));
    }
    assert.ok(after > before, `${cancelled} stayed ${before}`);
  });

  await check('a wrong API key: the server\'s error is shown on the reply', async () => {
    await setField(page, 'max_tokens', String(N));
    await setField(page, 'api_key', 'wrong-key');
    const r = await sendAndWait(page, 'Hello?', 4);
    assert.equal(r.state, 'error');
    assert.match(r.error ?? '', /HTTP 401: missing or wrong API key/);
  });

  await check('an attached image goes as an image_url part; a model without a tower answers 400 naming --mmproj', async () => {
    await page.click('#new-chat');
    await setField(page, 'api_key', KEY);
    let body = null;
    const onRequest = (req) => {
      if (req.url().endsWith('/v1/chat/completions')) body = JSON.parse(req.postData());
      req.continue();
    };
    await page.setRequestInterception(true);
    page.on('request', onRequest);
    try {
      await (await page.$('#attach-file')).uploadFile(IMAGE);
      await page.waitForFunction(() => !document.getElementById('attached').hidden);
      const r = await sendAndWait(page, 'What is on the screen?', 1);
      const user = body.messages[body.messages.length - 1];
      assert.equal(user.content[0].type, 'image_url');
      assert.match(user.content[0].image_url.url, /^data:image\/png;base64,iVBORw0KGgo/);
      assert.deepEqual(user.content[1], { type: 'text', text: 'What is on the screen?' });
      assert.equal(r.state, 'error');
      assert.match(r.error ?? '', /--mmproj/);
      assert.equal(await page.$$eval('.msg.user img.shot', (a) => a.length), 1);
      assert.equal(await page.$eval('#attached', (e) => e.hidden), true);
    } finally {
      page.off('request', onRequest);
      await page.setRequestInterception(false);
      await setField(page, 'api_key', 'wrong-key'); // as the checks after the wrong key's expect
    }
  });

  await check('reasoning, tool calls, markup and a mid-stream error (canned streams) are shown as they should', async () => {
    // stories260K neither thinks nor calls tools: the page's parsing of those
    // deltas is checked on canned SSE answered in place of the server's
    const streams = [sse([
      { choices: [{ index: 0, delta: { role: 'assistant', reasoning_content: 'Let me think' } }] },
      { choices: [{ index: 0, delta: { reasoning_content: ' about it.' } }] },
      { choices: [{ index: 0, delta: { content: '<img src=x onerror="window.pwned=1"> Calling.' } }] },
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '' } }] } }] },
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] } }] },
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] } }] },
      { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] },
      { choices: [], usage: { prompt_tokens: 9, completion_tokens: 7, total_tokens: 16, prompt_tokens_details: { cached_tokens: 4 } } },
    ]), sse([
      { choices: [{ index: 0, delta: { role: 'assistant', content: 'Half' } }] },
      { error: { message: 'the server ran out of memory while streaming this reply', type: 'server_error' } },
    ])];
    const onRequest = (req) => {
      if (req.url().endsWith('/v1/chat/completions') && streams.length) {
        req.respond({ status: 200, contentType: 'text/event-stream', body: streams.shift() });
      } else {
        req.continue();
      }
    };
    await page.setRequestInterception(true);
    page.on('request', onRequest);
    try {
      await page.click('#new-chat');
      const r = await sendAndWait(page, 'Weather in Paris?', 1);
      assert.equal(r.state, 'done', JSON.stringify(r));
      assert.equal(r.text, '<img src=x onerror="window.pwned=1"> Calling.');
      const shown = await page.evaluate(() => {
        const m = document.querySelector('.msg.assistant');
        const t = m.querySelector('.thinking');
        return {
          images: m.querySelectorAll('img').length, pwned: window.pwned === 1,
          thinking: t?.querySelector('.text').textContent, open: t?.open,
          tool: m.querySelector('.tool .name')?.textContent, args: m.querySelector('.tool pre')?.textContent,
        };
      });
      assert.deepEqual(shown, {
        images: 0, pwned: false, thinking: 'Let me think about it.', open: false,
        tool: 'tool call: get_weather', args: JSON.stringify({ city: 'Paris' }, null, 2),
      });
      assert.match(r.statsText, /cached 4\/9 prompt tokens/);
      const e = await sendAndWait(page, 'Again?', 2);
      assert.equal(e.state, 'error');
      assert.equal(e.text, 'Half');
      assert.match(e.error ?? '', /ran out of memory while streaming/);
    } finally {
      page.off('request', onRequest);
      await page.setRequestInterception(false);
    }
  });

  await check('settings persist across a reload (localStorage)', async () => {
    await page.reload({ waitUntil: 'load' });
    assert.equal(await page.$eval('#temperature', (e) => e.value), '0');
    assert.equal(await page.$eval('#max_tokens', (e) => e.value), String(N));
    assert.equal(await page.$eval('#api_key', (e) => e.value), 'wrong-key');
  });

  await check('no script errors on the page, nothing blocked by its CSP', async () => {
    assert.deepEqual(pageErrors, []);
    // typing grows the composer (app.js sets its height): a style the CSP must allow
    await page.type('#input', 'one more line');
    await page.keyboard.down('Shift');
    await page.keyboard.press('Enter');
    await page.keyboard.up('Shift');
    await page.type('#input', 'and a second');
    assert.deepEqual(await page.evaluate(() => window.cspViolations), []);
    assert.equal(await page.$eval('#input', (e) => e.value), 'one more line\nand a second');
  });
}

await run(main);
