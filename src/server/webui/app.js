// app.js - kettle's chat page: a conversation with the model of the
// `kettle serve` that served this page, through its own OpenAI API.
//
//   GET  /v1/models            the model picker
//   POST /v1/chat/completions  stream: true, stream_options.include_usage,
//                              read with fetch + ReadableStream (EventSource
//                              cannot POST); Stop aborts the fetch and the
//                              server cancels the request when it sees the
//                              connection close
//
// Per reply it shows TTFT (send -> first delta), tokens/s (completion tokens
// over first -> last delta) and cached / prompt tokens from the usage chunk.
// Model text is only ever set with textContent, never parsed as HTML.
// No dependencies, no build step: this file is served as it is.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const SETTINGS_KEY = 'kettle.webui.settings';
  // Settings fields: [element id, kind]; 'int' / 'float' are sent as
  // numbers when filled, empty means the server's default.
  const FIELDS = [
    ['system', 'text'], ['temperature', 'float'], ['top_p', 'float'], ['top_k', 'int'],
    ['min_p', 'float'], ['max_tokens', 'int'], ['seed', 'int'], ['api_key', 'text'],
    ['priority', 'int'], ['model', 'text'],
  ];
  const SAMPLING = ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed'];

  // The conversation as the API takes it (system prompt not included: it is
  // read from the settings at each send, so editing it applies to the next turn).
  let history = [];
  let controller = null; // the AbortController of the reply streaming now
  let savedModel = '';   // the model chosen last time, selected once listed
  let chatId = 0;        // bumped by New chat, so a reply ending late stays out of the new one

  // ---- settings ----

  function loadSettings() {
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || '{}') || {}; } catch { saved = {}; }
    for (const [id] of FIELDS) if (typeof saved[id] === 'string' && id !== 'model') $(id).value = saved[id];
    savedModel = typeof saved.model === 'string' ? saved.model : '';
  }

  function saveSettings() {
    const out = {};
    for (const [id] of FIELDS) out[id] = $(id).value;
    try { localStorage.setItem(SETTINGS_KEY, JSON.stringify(out)); } catch { /* private mode: not kept */ }
  }

  // A number field's value, or undefined when empty or not a number.
  function numberOf(id, kind) {
    const raw = $(id).value.trim();
    if (raw === '') return undefined;
    const v = kind === 'int' ? parseInt(raw, 10) : parseFloat(raw);
    return Number.isFinite(v) ? v : undefined;
  }

  function headers() {
    const h = { 'Content-Type': 'application/json' };
    const key = $('api_key').value.trim();
    if (key) h.Authorization = `Bearer ${key}`;
    return h;
  }

  // ---- small DOM helpers ----

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Keeps the view at the bottom while it is there (not while reading above).
  function stickToBottom(fn) {
    const box = $('messages');
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    fn();
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function addMessage(role, text) {
    $('empty').hidden = true;
    const m = el('div', `msg ${role}`);
    m.append(el('div', 'who', role === 'user' ? 'You' : role === 'assistant' ? $('model').value || 'assistant' : role));
    stickToBottom(() => $('messages').append(m));
    if (text !== undefined) m.append(el('div', 'content', text));
    return m;
  }

  // A server or network error, shown in the conversation (never swallowed).
  function showError(where, text) {
    stickToBottom(() => where.append(el('div', 'error-box', text)));
  }

  // The message of an OpenAI error object, or of anything else.
  function errorText(status, body) {
    const e = body && body.error;
    if (e && typeof e === 'object') return `${status ? `HTTP ${status}: ` : ''}${e.message || JSON.stringify(e)}`;
    if (typeof e === 'string') return `${status ? `HTTP ${status}: ` : ''}${e}`;
    return `HTTP ${status}`;
  }

  async function failure(res) {
    let body = null;
    const text = await res.text().catch(() => '');
    try { body = JSON.parse(text); } catch { body = text ? { error: text } : null; }
    return errorText(res.status, body);
  }

  // ---- models ----

  async function loadModels() {
    const sel = $('model');
    try {
      const res = await fetch('v1/models', { headers: headers() });
      if (!res.ok) throw new Error(await failure(res));
      const ids = ((await res.json()).data || []).map((m) => m.id);
      const keep = sel.value || savedModel;
      sel.replaceChildren(...ids.map((id) => { const o = el('option', '', id); o.value = id; return o; }));
      if (ids.includes(keep)) sel.value = keep;
      sel.dataset.loaded = 'true';
    } catch (e) {
      sel.replaceChildren();
      sel.dataset.loaded = 'error';
      const m = addMessage('system');
      showError(m, `cannot list the models: ${e.message}`);
    }
  }

  // ---- one reply ----

  // What a reply's block shows while it streams, and its numbers.
  class Reply {
    constructor() {
      this.msg = addMessage('assistant');
      this.msg.dataset.state = 'streaming';
      this.bubble = el('div', 'bubble');
      this.thinking = null;  // <details> once reasoning arrives
      this.content = el('div', 'content');
      this.tools = new Map(); // index -> {box, name, pre, id, fname, args}
      this.stats = el('div', 'stats');
      this.bubble.append(this.content, this.stats);
      stickToBottom(() => this.msg.append(this.bubble));
      this.text = '';
      this.reasoning = '';
      this.t0 = performance.now();
      this.tFirst = 0;
      this.tLast = 0;
      this.deltas = 0;
      this.usage = null;
      this.finish = null;
    }

    // The first and last delta times, for TTFT and tokens/s.
    tick() {
      const now = performance.now();
      if (!this.tFirst) this.tFirst = now;
      this.tLast = now;
      this.deltas++;
    }

    addReasoning(s) {
      if (!this.thinking) {
        this.thinking = el('details', 'thinking');
        this.thinking.open = true;
        this.thinkSummary = el('summary', '', 'Thinking\u2026');
        this.thinkText = el('div', 'text');
        this.thinking.append(this.thinkSummary, this.thinkText);
        this.bubble.prepend(this.thinking);
      }
      this.reasoning += s;
      stickToBottom(() => { this.thinkText.textContent = this.reasoning; });
    }

    addContent(s) {
      // once the answer starts, the thinking folds away (one click reopens it)
      if (this.thinking && this.thinking.open && !this.text) {
        this.thinking.open = false;
        this.thinkSummary.textContent = 'Thought';
      }
      this.text += s;
      stickToBottom(() => { this.content.textContent = this.text; });
    }

    // A tool_calls delta: the first for an index has its id and name, the
    // rest add pieces of the arguments' JSON.
    addToolCall(d) {
      const i = d.index ?? 0;
      let t = this.tools.get(i);
      if (!t) {
        t = { box: el('div', 'tool'), name: el('div', 'name'), pre: el('pre', 'args'), id: '', fname: '', args: '' };
        t.box.append(t.name, t.pre);
        this.bubble.insertBefore(t.box, this.stats);
        this.tools.set(i, t);
      }
      if (d.id) t.id = d.id;
      if (d.function && d.function.name) t.fname += d.function.name;
      if (d.function && typeof d.function.arguments === 'string') t.args += d.function.arguments;
      stickToBottom(() => {
        t.name.textContent = `tool call: ${t.fname || '?'}`;
        t.pre.textContent = t.args;
      });
    }

    // Arguments pretty-printed once complete (left as they came if not JSON).
    finishTools() {
      for (const t of this.tools.values()) {
        try { t.pre.textContent = JSON.stringify(JSON.parse(t.args), null, 2); } catch { /* partial or not JSON */ }
      }
    }

    // Writes the figures line; state: done, stopped or error.
    end(state) {
      this.msg.dataset.state = state;
      if (this.tools.size) this.finishTools();
      if (this.thinking && this.thinkSummary.textContent !== 'Thought') this.thinkSummary.textContent = 'Thought';
      const s = this.stats;
      const add = (cls, text) => s.append(el('span', cls, text));
      s.replaceChildren();
      if (this.tFirst) {
        const ttft = this.tFirst - this.t0;
        s.dataset.ttftMs = ttft.toFixed(1);
        add('ttft', `TTFT ${ttft < 10 ? ttft.toFixed(1) : Math.round(ttft)} ms`);
      }
      const u = this.usage;
      if (u) {
        const n = u.completion_tokens;
        const span = (this.tLast - this.tFirst) / 1000;
        s.dataset.completionTokens = String(n);
        if (n > 1 && span > 0) {
          const tps = n / span;
          s.dataset.tps = tps.toFixed(1);
          add('tps', `${tps < 100 ? tps.toFixed(1) : Math.round(tps)} tok/s`);
        }
        const cached = (u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens) || 0;
        s.dataset.cached = String(cached);
        s.dataset.prompt = String(u.prompt_tokens);
        add('cached', `cached ${cached}/${u.prompt_tokens} prompt tokens`);
        add('tokens', `${n} tokens`);
      } else if (this.deltas > 1 && this.tLast > this.tFirst) {
        // stopped: no usage chunk came; kettle sends about a token a delta
        const tps = (this.deltas - 1) / ((this.tLast - this.tFirst) / 1000);
        s.dataset.tps = tps.toFixed(1);
        add('tps', `\u2248${Math.round(tps)} tok/s`);
        add('tokens', `\u2248${this.deltas} tokens`);
      }
      if (this.finish && this.finish !== 'stop') add('note', `finish: ${this.finish}`);
      if (state === 'stopped') add('flag', 'stopped');
      if (!s.childElementCount) s.remove();
    }
  }

  // Splits SSE text into events; returns the unfinished tail.
  function takeEvents(buf, onData) {
    const parts = buf.split(/\r?\n\r?\n/);
    const tail = parts.pop();
    for (const ev of parts) {
      const data = ev.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (data) onData(data);
    }
    return tail;
  }

  // One chunk of the stream; returns false at [DONE].
  function onChunk(reply, data) {
    if (data === '[DONE]') return false;
    let c;
    try { c = JSON.parse(data); } catch { throw new Error(`the server sent a chunk that is not JSON: ${data.slice(0, 200)}`); }
    if (c.error) throw new Error(errorText(0, c));
    if (c.usage) reply.usage = c.usage;
    for (const ch of c.choices || []) {
      const d = ch.delta || {};
      if (typeof d.reasoning_content === 'string' && d.reasoning_content) { reply.tick(); reply.addReasoning(d.reasoning_content); }
      if (typeof d.content === 'string' && d.content) { reply.tick(); reply.addContent(d.content); }
      if (Array.isArray(d.tool_calls)) { reply.tick(); d.tool_calls.forEach((t) => reply.addToolCall(t)); }
      if (ch.finish_reason) reply.finish = ch.finish_reason;
    }
    return true;
  }

  function requestBody() {
    const messages = [];
    const system = $('system').value.trim();
    if (system) messages.push({ role: 'system', content: system });
    messages.push(...history);
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    if ($('model').value) body.model = $('model').value;
    for (const id of SAMPLING) {
      const v = numberOf(id, FIELDS.find((f) => f[0] === id)[1]);
      if (v !== undefined) body[id] = v;
    }
    const prio = numberOf('priority', 'int');
    if (prio) body.priority = prio;
    return body;
  }

  function setBusy(busy) {
    $('send').hidden = busy;
    $('stop').hidden = !busy;
  }

  // The image to send with the next message (a data: URL), or null.
  let attached = null;

  function attach(file) {
    if (!file) return;
    const r = new FileReader();
    r.onload = () => {
      attached = r.result;
      $('attached-img').src = attached;
      $('attached').hidden = false;
    };
    r.readAsDataURL(file);
  }

  function detach() {
    attached = null;
    $('attached').hidden = true;
    $('attach-file').value = '';
  }

  async function send() {
    const input = $('input');
    const text = input.value.trim();
    if ((!text && !attached) || controller) return;
    input.value = '';
    autosize();
    const shown = addMessage('user', text);
    if (attached) {
      const img = el('img', 'shot');
      img.src = attached;
      img.alt = 'attached image';
      shown.insertBefore(img, shown.querySelector('.content'));
      // OpenAI's content parts: the image, then the text
      const content = [{ type: 'image_url', image_url: { url: attached } }];
      if (text) content.push({ type: 'text', text });
      history.push({ role: 'user', content });
      detach();
    } else {
      history.push({ role: 'user', content: text });
    }
    const reply = new Reply();
    const myChat = chatId;
    controller = new AbortController();
    setBusy(true);
    let state = 'done';
    try {
      const res = await fetch('v1/chat/completions', {
        method: 'POST', headers: headers(), body: JSON.stringify(requestBody()), signal: controller.signal,
      });
      if (!res.ok) throw new Error(await failure(res));
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      let more = true;
      while (more) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        buf = takeEvents(buf, (data) => { if (more) more = onChunk(reply, data); });
      }
      if (more) throw new Error('the stream ended before [DONE]');
    } catch (e) {
      if (e.name === 'AbortError') {
        state = 'stopped';
      } else {
        state = 'error';
        showError(reply.bubble, e.message || String(e));
      }
    } finally {
      if (state === 'error') controller.abort(); // an error mid-stream: hang up, do not read on
      controller = null;
      setBusy(false);
    }
    reply.end(state);
    if (myChat !== chatId) return; // New chat was pressed meanwhile
    if (state === 'error' && !reply.text) {
      history.pop(); // the turn did not happen: sending again must not repeat it
    } else {
      // what was said, also when stopped part way (as the user saw it);
      // tool calls are shown but not sent back: this page runs no tools
      history.push({ role: 'assistant', content: reply.text });
    }
    input.focus();
  }

  function stop() {
    if (controller) controller.abort();
  }

  function newChat() {
    stop();
    chatId++;
    history = [];
    const box = $('messages');
    box.replaceChildren($('empty'));
    $('empty').hidden = false;
    $('input').focus();
  }

  // The composer grows with its text, up to its CSS max-height.
  function autosize() {
    const t = $('input');
    t.style.height = 'auto';
    t.style.height = `${t.scrollHeight + 2}px`;
  }

  function toggleSettings(show) {
    const s = $('settings');
    s.hidden = show === undefined ? !s.hidden : !show;
    $('toggle-settings').setAttribute('aria-expanded', String(!s.hidden));
  }

  // ---- wiring ----

  function init() {
    loadSettings();
    if (window.matchMedia('(max-width: 760px)').matches) toggleSettings(false);
    for (const [id] of FIELDS) $(id).addEventListener('change', saveSettings);
    for (const [id] of FIELDS) $(id).addEventListener('input', saveSettings);
    $('api_key').addEventListener('change', loadModels);
    $('send').addEventListener('click', send);
    $('attach').addEventListener('click', () => $('attach-file').click());
    $('attach-file').addEventListener('change', (e) => attach(e.target.files[0]));
    $('detach').addEventListener('click', detach);
    $('stop').addEventListener('click', stop);
    $('new-chat').addEventListener('click', newChat);
    $('toggle-settings').addEventListener('click', () => toggleSettings());
    $('close-settings').addEventListener('click', () => toggleSettings(false));
    $('reset-settings').addEventListener('click', () => {
      for (const [id] of FIELDS) if (id !== 'model' && id !== 'api_key') $(id).value = id === 'priority' ? '0' : '';
      saveSettings();
    });
    const input = $('input');
    input.addEventListener('input', autosize);
    input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      }
    });
    loadModels();
    input.focus();
  }

  init();
})();
