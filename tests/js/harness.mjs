// harness.mjs - what the JS tests of kettle share: a `kettle serve` child
// on a free loopback port, checks that print one line each, and a run that
// always stops every server it started (also on failure, on a signal, and
// by a global timeout), so no server outlives a test.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

const START_TIMEOUT_MS = 30_000;

// bin: the kettle binary; model: the GGUF served; pass: the word a passing
// check prints ('ok', 'PASS'); globalTimeoutMs: the whole test's budget.
export function harness({ bin, model, pass = 'ok', globalTimeoutMs = 90_000 }) {
  const servers = new Set();
  let failures = 0;

  // Starts `kettle serve ARGS`; resolves to {proc, port, stderr} once it
  // prints its "listening on" line, rejects if it exits first or takes
  // over 30 s.
  // opts.model: another GGUF than the harness's.
  function startServer(extra = [], opts = {}) {
    const args = ['serve', '-m', opts.model || model, '--port', '0', '--chat-template', 'chatml', '-t', '2', ...extra];
    const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    const srv = { proc, port: 0, stderr: '', exited: null };
    servers.add(srv);
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => { srv.stderr += d; });
    const exited = new Promise((resolve) => proc.on('exit', (code, signal) => {
      srv.exited = { code, signal };
      servers.delete(srv);
      resolve(srv.exited);
    }));
    srv.exitedPromise = exited;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`kettle serve did not print its listening line within ${START_TIMEOUT_MS / 1000} s:\n${srv.stderr}`));
      }, START_TIMEOUT_MS);
      const check = () => {
        const m = /listening on http:\/\/[^\s:]+:(\d+)/.exec(srv.stderr);
        if (m) {
          clearTimeout(timer);
          proc.stderr.off('data', check);
          srv.port = Number(m[1]);
          resolve(srv);
        }
      };
      proc.stderr.on('data', check);
      proc.on('error', (e) => { clearTimeout(timer); reject(new Error(`cannot start ${bin}: ${e.message}`)); });
      exited.then(({ code, signal }) => {
        clearTimeout(timer);
        reject(new Error(`kettle serve exited early (code ${code}, signal ${signal}):\n${srv.stderr}`));
      });
    });
  }

  // SIGTERM, then SIGKILL after 5 s; resolves to the exit {code, signal}.
  async function stopServer(srv) {
    if (srv.exited) return srv.exited;
    srv.proc.kill('SIGTERM');
    const killer = setTimeout(() => srv.proc.kill('SIGKILL'), 5000);
    const r = await srv.exitedPromise;
    clearTimeout(killer);
    return r;
  }

  function killAll() {
    for (const s of servers) s.proc.kill('SIGKILL');
  }
  process.on('exit', killAll);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => { killAll(); process.exit(1); });
  }
  const globalTimer = setTimeout(() => {
    console.log(`FAIL - global timeout: the test ran over ${globalTimeoutMs / 1000} s`);
    killAll();
    process.exit(1);
  }, globalTimeoutMs);

  // Runs one named check; a failure is counted and printed, never thrown.
  async function check(name, fn) {
    try {
      await fn();
      console.log(`${pass} - ${name}`);
    } catch (e) {
      failures++;
      const detail = e instanceof assert.AssertionError ? e.message : (e && e.stack) || String(e);
      console.log(`FAIL - ${name}: ${detail.replace(/\n/g, '\n    ')}`);
    }
  }

  // Runs main, stops every server, exits 0 only if every check passed.
  async function run(main) {
    let code = 1;
    try {
      await main();
      code = failures ? 1 : 0;
      console.log(failures ? `# ${failures} check(s) failed` : '# all checks passed');
    } catch (e) {
      console.log(`FAIL - setup: ${(e && e.stack) || e}`);
    } finally {
      await Promise.all([...servers].map(stopServer));
      clearTimeout(globalTimer);
    }
    process.exit(code);
  }

  return { startServer, stopServer, check, run };
}
