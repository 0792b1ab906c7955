// bench.mjs - llama.cpp's pp/tg throughput on a GGUF file, for setting
// kettle's `kettle bench` figures side by side with llama.cpp on the same
// machine (docs/PERFORMANCE.md, "llama.cpp side by side").
//
// llama.cpp cannot be fetched from GitHub here; the npm package
// node-llama-cpp ships prebuilt llama.cpp CPU libraries
// (@node-llama-cpp/linux-x64), so this drives llama.cpp through it:
//
//     npm ci --prefix bench/llamacpp --ignore-scripts
//     node bench/llamacpp/bench.mjs MODEL.gguf        # env P=512 N=128 R=3 T=2
//
// pp: P random token ids evaluated as one batch from an empty sequence;
// tg: N greedy tokens one at a time (includes node-llama-cpp's sampling
// and JS overhead, 5-10% by llama.cpp's own timer, printed as PERF lines).
// One warm-up of each is excluded; prints min and median of R runs.
// Caveat measured here: at 2 threads node-llama-cpp's generation of small
// models is dominated by thread synchronisation (smollm-sized models decode
// slower at 2 threads than at 1), so tg of small models is understated.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
const file = process.argv[2];
const P = +(process.env.P ?? 512), N = +(process.env.N ?? 128), R = +(process.env.R ?? 3), T = +(process.env.T ?? 2);
const logs = []; let perf = [];
const llama = await getLlama({gpu: false, build: "never", maxThreads: T, logLevel: LlamaLogLevel.debug,
  logger: (lvl, msg) => { if (/eval time|load time|sample time|graphs reused/.test(msg)) perf.push(msg.trim()); else if (/load_backend|repack|CPU_REPACK|system_info/i.test(msg)) logs.push(msg.trim()); }});
console.log("buildType", llama.buildType, "release", JSON.stringify(llama.llamaCppRelease), "gpu", llama.gpu);
console.log("systemInfo", llama.systemInfo);
const model = await llama.loadModel({modelPath: file, gpuLayers: 0});
const ctx = await model.createContext({contextSize: P + N, batchSize: P, sequences: 1, threads: {ideal: T, min: T}, flashAttention: false, performanceTracking: true});
console.log("ctx", ctx.contextSize, "batch", ctx.batchSize, "threads", ctx.currentThreads, "vocab", model.tokens ? "" : "");
for (const l of logs.filter(l=>!/repack tensor/.test(l)).slice(0,8)) console.log("LOG", l);
llama.logLevel = LlamaLogLevel.info;
const seq = ctx.getSequence();
const nvocab = model.fileInsights?.tokens ?? 32000;
const vocab = 32000;
function rndTokens(n) { const a = []; for (let i = 0; i < n; i++) a.push(1 + Math.floor(Math.random() * (vocab - 1))); return a; }
async function pp() { await seq.clearHistory(); await ctx.printTimings(); perf = []; const toks = rndTokens(P); const t0 = process.hrtime.bigint();
  await seq.evaluateWithoutGeneratingNewTokens(toks); const t1 = process.hrtime.bigint(); await ctx.printTimings(); console.log("PERF pp", perf.join(" // ")); return P / (Number(t1 - t0) / 1e9); }
async function tg() { await seq.clearHistory(); await ctx.printTimings(); perf = []; let n = 0; const t0 = process.hrtime.bigint();
  for await (const tok of seq.evaluate([1 + Math.floor(Math.random()*(vocab-1))], {temperature: 0})) { if (++n >= N) break; }
  const t1 = process.hrtime.bigint(); await ctx.printTimings(); console.log("PERF tg", perf.join(" // ")); return [n / (Number(t1 - t0) / 1e9), n]; }
const med = a => { const s = [...a].sort((x, y) => x - y); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m-1] + s[m]) / 2; };
const f = x => x.toFixed(2);
// warm-up
await pp(); await tg();
const ppr = [], tgr = [];
for (let r = 0; r < R; r++) ppr.push(await pp());
for (let r = 0; r < R; r++) { const [v, n] = await tg(); if (n !== N) console.log("WARN tg tokens", n); tgr.push(v); }
console.log(`RESULT ${file} pp${P} t/s: ${ppr.map(f).join(" ")} | min ${f(Math.min(...ppr))} median ${f(med(ppr))} max ${f(Math.max(...ppr))}`);
console.log(`RESULT ${file} tg${N} t/s: ${tgr.map(f).join(" ")} | min ${f(Math.min(...tgr))} median ${f(med(tgr))} max ${f(Math.max(...tgr))}`);
console.log("REPACK lines:", logs.filter(l=>/repack tensor/.test(l)).length, [...new Set(logs.filter(l=>/repack tensor/.test(l)).map(l=>l.replace(/.* with /,"")))].join(","));
await llama.dispose();
