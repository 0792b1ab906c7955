// ratios.mjs - the kettle / llama.cpp table of one or more
// side_by_side.sh outputs: per model and test, kettle's t/s in each pass,
// then per llama.cpp build its t/s and kettle's ratio to it, in markdown,
// with ratios below issue 4's targets (pp 1.5x, tg 1.3x) in bold.
//
//     bench/llamacpp/side_by_side.sh LB1,LB2 ./build/kettle 2 MODELS... > run1.txt
//     node bench/llamacpp/ratios.mjs run1.txt [run2.txt ...]
//
// The passes of later files continue the numbering of earlier ones. Each
// figure is the mean of its runs (llama-bench's and kettle bench's first
// number), as side_by_side.sh prints them. Needs nothing outside Node.
import {readFileSync} from "node:fs";

const files = process.argv.slice(2);
if (files.length === 0) {
    console.error("usage: node ratios.mjs SIDE_BY_SIDE_OUTPUT...");
    process.exit(2);
}

const rows = new Map(); // "model test" -> {model, test, builds: Map(name -> Map(pass -> t/s))}
const builds = [];      // llama.cpp builds in order of appearance, then "kettle"
let passBase = 0;
for (const file of files) {
    let pass = 0, model = null, who = null, maxPass = 0;
    for (const line of readFileSync(file, "utf8").split("\n")) {
        let m = line.match(/^=== pass (\d+) (\S+\.gguf)/);
        if (m) {
            pass = passBase + Number(m[1]), model = m[2], who = null;
            maxPass = Math.max(maxPass, Number(m[1]));
            continue;
        }
        m = line.match(/^--- (\S+)/);
        if (m) {
            who = m[1];
            continue;
        }
        if (!model || !line.startsWith("|")) continue;
        const cells = line.split("|").slice(1, -1).map((c) => c.trim());
        const test = cells.find((c) => /^(pp|tg)\d+$/.test(c));
        if (!test) continue;
        // kettle's lines start with the file name and carry the mean in
        // column 6; llama-bench's end with "mean ± sd"
        const isKettle = cells[0].endsWith(".gguf");
        const name = isKettle ? "kettle" : who ?? "llama.cpp";
        const value = parseFloat(isKettle ? cells[5] : cells[cells.length - 1]);
        if (!Number.isFinite(value)) continue;
        if (!builds.includes(name)) builds.push(name);
        const key = `${model} ${test}`;
        if (!rows.has(key)) rows.set(key, {model, test, builds: new Map()});
        const r = rows.get(key);
        if (!r.builds.has(name)) r.builds.set(name, new Map());
        r.builds.get(name).set(pass, value);
    }
    passBase += maxPass;
}

const llamas = builds.filter((b) => b !== "kettle");
// a build's short name: the folder holding its build/ (ll36/build/bin/llama-bench -> ll36)
const short = (b) => {
    const parts = b.split("/"), i = parts.lastIndexOf("build");
    return i > 0 ? parts[i - 1] : b;
};
const fmt = (v) => (v === undefined ? "-" : v >= 1000 ? v.toFixed(0) : v.toFixed(1));
for (const test of ["pp", "tg"]) {
    const target = test === "pp" ? 1.5 : 1.3;
    const mine = [...rows.values()].filter((r) => r.test.startsWith(test));
    if (mine.length === 0) continue;
    const head = ["model", `kettle ${mine[0].test}`];
    for (const b of llamas) head.push(short(b), `kettle / ${short(b)}`);
    console.log(`\n| ${head.join(" | ")} |\n|${head.map(() => "---").join("|")}|`);
    for (const r of mine) {
        const k = r.builds.get("kettle") ?? new Map();
        const passes = [...k.keys()].sort((a, b) => a - b);
        const cells = [`${r.model} ${r.test}`, passes.map((p) => fmt(k.get(p))).join(" / ")];
        for (const b of llamas) {
            const l = r.builds.get(b) ?? new Map();
            cells.push(passes.map((p) => fmt(l.get(p))).join(" / "));
            cells.push(passes.map((p) => {
                if (!l.has(p)) return "-";
                const x = k.get(p) / l.get(p), s = x.toFixed(2);
                return x >= target ? s : `**${s}**`;
            }).join(" / "));
        }
        console.log(`| ${cells.join(" | ")} |`);
    }
}
