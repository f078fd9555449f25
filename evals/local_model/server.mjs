// twice's local model server: an OpenAI-compatible /v1/chat/completions over a GGUF model,
// run by node-llama-cpp's prebuilt CPU runtime. twice starts it, waits for /health, stops it.
//
// Usage: node server.mjs --model FILE.gguf --modules NODE_MODULES_DIR [--host 127.0.0.1]
//        [--port 0] [--name NAME] [--threads 1] [--context 4096] [--seed 0]
//        node server.mjs --script REPLIES.json [--name NAME]      (tests: no model, no runtime)
// Prints "listening on http://HOST:PORT" once it accepts requests (the model is loaded).
// With --script the replies are the JSON list's strings, in order, instead of generated text
// (so tests can check parsing and counting without depending on what a model says); an entry
// {"exit": N} makes the server exit with code N when that request arrives (a dead server), and
// {"sleep": S, "reply": TEXT} answers TEXT after S seconds (a slow model, to interrupt).
//
// Threads default to 1: on 2 shared cores llama.cpp's busy-waiting worker threads stall each
// other (measured: one short reply took 4 s with 1 thread and 43 s with 2 on a loaded box).
//
// Tool calls. The prompt is the model's own chat template (read from the GGUF), rendered with
// the request's tools. Small models answer a tool request in one of a few shapes; the reply is
// parsed leniently but only into these documented shapes (anything else is not a call):
//   tag      <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (the template's own)
//   fenced   ```json\n{"name": ..., "arguments": {...}}\n```            (a fenced code block)
//   bare     {"name": ..., "arguments": {...}}                          (the whole reply is JSON)
// "parameters" is accepted for "arguments"; one reply may hold several calls of one shape.
// A reply with none of these markers is plain text (shape "text"); a reply that has a marker
// (a <tool_call> tag, a fence or a leading "{") but no valid call is "unparseable" and is
// returned as text. Every response carries {"twice_parse": {"shape": ...}} so the count per
// shape reaches inspect's log (ModelEvent.call.response); GET /stats has the running totals.

import http from "node:http";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
    const out = { host: "127.0.0.1", port: 0, threads: 1, context: 4096, seed: 0, name: "", parent: 0 };
    for (let i = 0; i < argv.length; i += 2) {
        const key = argv[i].replace(/^--/, "");
        if (!(key in out) && !["model", "modules", "script"].includes(key)) {
            console.error(`server.mjs: unknown option --${key}`);
            process.exit(2);
        }
        out[key] = typeof out[key] === "number" ? Number(argv[i + 1]) : argv[i + 1];
    }
    if (!out.script && (!out.model || !out.modules)) {
        console.error("server.mjs: --model FILE.gguf and --modules DIR (or --script) are required");
        process.exit(2);
    }
    return out;
}

const args = parseArgs(process.argv.slice(2));
// One model, one context sequence: requests are generated one at a time (see `serially`).
const runtime = args.script ? await scripted(args.script) : await loadModel();

async function loadModel() {
    const importFrom = (pkg, entry) => import(pathToFileURL(join(args.modules, pkg, entry)).href);
    const { getLlama, LlamaCompletion } = await importFrom("node-llama-cpp", "dist/index.js");
    const { Template } = await importFrom("@huggingface/jinja", "dist/index.js");
    // Only the prebuilt CPU binary: never build, never download (the machine is offline).
    const llama = await getLlama({
        gpu: false,
        build: "never",
        skipDownload: true,
        progressLogs: false,
        logLevel: "error",
    });
    const model = await llama.loadModel({ modelPath: args.model });
    const context = await model.createContext({
        contextSize: args.context,
        threads: args.threads,
        sequences: 1,
    });
    const completion = new LlamaCompletion({ contextSequence: context.getSequence() });
    const templateText = model.fileInfo.metadata?.tokenizer?.chat_template;
    if (!templateText) {
        console.error(`server.mjs: ${args.model} has no chat template in its metadata`);
        process.exit(1);
    }
    const template = new Template(templateText);
    return {
        name: args.name || model.fileInfo.metadata?.general?.name || "local",
        async generate(body) {
            const tokens = model.tokenize(renderPrompt(template, body), true);
            if (tokens.length >= args.context) {
                // Refused, not generated: the model would see a cut prompt and answer it as
                // if whole, and the trial would count as a real (failed) result.
                throw Object.assign(
                    new Error(
                        `the prompt is ${tokens.length} tokens, more than the model's context ` +
                            `of ${args.context} ([local_model] context)`,
                    ),
                    { status: 400 },
                );
            }
            const result = await completion.generateCompletionWithMeta(tokens, {
                maxTokens: body.max_tokens ?? body.max_completion_tokens ?? 512,
                temperature: body.temperature ?? 0,
                seed: body.seed ?? args.seed,
                customStopTriggers: ["<|im_end|>", "<|endoftext|>"],
            });
            return {
                text: result.response,
                promptTokens: tokens.length,
                completionTokens: model.tokenize(result.response, false).length,
                truncated: result.metadata.stopReason === "maxTokens",
            };
        },
        async dispose() {
            await context.dispose();
            await model.dispose();
            await llama.dispose();
        },
    };
}

async function scripted(file) {
    const { readFile } = await import("node:fs/promises");
    const replies = JSON.parse(await readFile(file, "utf8"));
    let next = 0;
    return {
        name: args.name || "scripted",
        async generate() {
            const reply = replies[Math.min(next++, replies.length - 1)];
            if (reply && typeof reply === "object" && "exit" in reply) process.exit(reply.exit);
            if (reply && typeof reply === "object" && "sleep" in reply) {
                // A slow model: answer after this many seconds (interrupt tests).
                await new Promise((done) => setTimeout(done, reply.sleep * 1000));
                return { text: String(reply.reply ?? ""), promptTokens: 0, completionTokens: 0, truncated: false };
            }
            return { text: String(reply), promptTokens: 0, completionTokens: 0, truncated: false };
        },
        async dispose() {},
    };
}

const SHAPES = ["tag", "fenced", "bare", "text", "unparseable"];
const stats = { requests: 0, shapes: Object.fromEntries(SHAPES.map((s) => [s, 0])) };

// --- tool-call parsing -------------------------------------------------------------------

function asCall(value, toolNames) {
    if (!value || typeof value !== "object" || Array.isArray(value)) return null;
    const name = value.name;
    let argsValue = value.arguments ?? value.parameters ?? {};
    if (typeof argsValue === "string") {
        try {
            argsValue = JSON.parse(argsValue);
        } catch {
            return null;
        }
    }
    if (typeof name !== "string" || !toolNames.has(name)) return null;
    if (!argsValue || typeof argsValue !== "object" || Array.isArray(argsValue)) return null;
    return { name, arguments: argsValue };
}

function callsFrom(jsonTexts, toolNames) {
    const calls = [];
    for (const text of jsonTexts) {
        let value;
        try {
            value = JSON.parse(text.trim());
        } catch {
            return null;
        }
        for (const item of Array.isArray(value) ? value : [value]) {
            const call = asCall(item, toolNames);
            if (!call) return null;
            calls.push(call);
        }
    }
    return calls.length ? calls : null;
}

export function parseReply(text, toolNames) {
    const tags = [...text.matchAll(/<tool_call>([\s\S]*?)(?:<\/tool_call>|$)/g)].map((m) => m[1]);
    if (tags.length) {
        const calls = callsFrom(tags, toolNames);
        return calls ? { shape: "tag", calls } : { shape: "unparseable", calls: [] };
    }
    const fences = [...text.matchAll(/```[a-zA-Z]*\s*\n?([\s\S]*?)```/g)].map((m) => m[1]);
    const jsonFences = fences.filter((f) => /^\s*[[{]/.test(f));
    if (jsonFences.length) {
        const calls = callsFrom(jsonFences, toolNames);
        return calls ? { shape: "fenced", calls } : { shape: "unparseable", calls: [] };
    }
    if (/^\s*[[{]/.test(text)) {
        const calls = callsFrom([text], toolNames);
        return calls ? { shape: "bare", calls } : { shape: "unparseable", calls: [] };
    }
    return { shape: "text", calls: [] };
}

// --- prompt ------------------------------------------------------------------------------

function templateMessages(messages) {
    // The template wants tool-call arguments as objects; OpenAI sends them as JSON strings.
    return messages.map((m) => {
        const content = Array.isArray(m.content)
            ? m.content.map((p) => (typeof p === "string" ? p : p.text ?? "")).join("")
            : m.content ?? "";
        const out = { ...m, content };
        if (Array.isArray(m.tool_calls)) {
            out.tool_calls = m.tool_calls.map((c) => {
                let a = c.function?.arguments ?? {};
                if (typeof a === "string") {
                    try {
                        a = JSON.parse(a);
                    } catch {
                        // keep the string: the model wrote it, the template shows it
                    }
                }
                return { ...c, function: { name: c.function?.name, arguments: a } };
            });
        }
        return out;
    });
}

function renderPrompt(template, body) {
    return template.render({
        messages: templateMessages(body.messages ?? []),
        tools: body.tools?.length ? body.tools : undefined,
        add_generation_prompt: true,
        bos_token: "",
        eos_token: "",
    });
}

// --- generation (one at a time: one context sequence) -------------------------------------

let queue = Promise.resolve();
function serially(fn) {
    const next = queue.then(fn, fn);
    queue = next.catch(() => {});
    return next;
}

async function chat(body) {
    const received = Date.now();
    let started = received;
    const result = await serially(() => {
        started = Date.now(); // generation only: time queued behind another request is apart
        return runtime.generate(body);
    });
    const finished = Date.now();
    const text = result.text.trim();
    const toolNames = new Set((body.tools ?? []).map((t) => t.function?.name).filter(Boolean));
    const parsed = toolNames.size ? parseReply(text, toolNames) : { shape: "text", calls: [] };
    stats.requests += 1;
    stats.shapes[parsed.shape] += 1;
    const id = `chatcmpl-${stats.requests}`;
    const message = { role: "assistant", content: parsed.calls.length ? null : text };
    if (parsed.calls.length) {
        message.tool_calls = parsed.calls.map((c, i) => ({
            id: `call_${stats.requests}_${i}`,
            type: "function",
            function: { name: c.name, arguments: JSON.stringify(c.arguments) },
        }));
    }
    return {
        id,
        object: "chat.completion",
        created: Math.floor(started / 1000),
        model: body.model ?? runtime.name,
        choices: [
            {
                index: 0,
                message,
                finish_reason: parsed.calls.length
                    ? "tool_calls"
                    : result.truncated
                      ? "length"
                      : "stop",
            },
        ],
        usage: {
            prompt_tokens: result.promptTokens,
            completion_tokens: result.completionTokens,
            total_tokens: result.promptTokens + result.completionTokens,
        },
        twice_parse: { shape: parsed.shape, raw: parsed.shape === "unparseable" ? text : undefined },
        twice_timing: {
            seconds: (finished - started) / 1000,
            queued_seconds: (started - received) / 1000,
        },
    };
}

// --- HTTP --------------------------------------------------------------------------------

function send(res, status, value) {
    const data = JSON.stringify(value);
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(data) });
    res.end(data);
}

const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
        try {
            const path = (req.url ?? "").split("?")[0].replace(/\/+$/, "");
            if (req.method === "GET" && path === "/health") {
                return send(res, 200, { status: "ok", model: runtime.name });
            }
            if (req.method === "GET" && path === "/stats") return send(res, 200, stats);
            if (req.method === "GET" && path === "/v1/models") {
                return send(res, 200, { object: "list", data: [{ id: runtime.name, object: "model" }] });
            }
            if (req.method === "POST" && path === "/v1/chat/completions") {
                const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
                if (body.stream) {
                    return send(res, 400, { error: { message: "stream is not supported" } });
                }
                return send(res, 200, await chat(body));
            }
            return send(res, 404, { error: { message: `no route ${req.method} ${path}` } });
        } catch (ex) {
            return send(res, ex?.status ?? 500, { error: { message: String(ex?.message ?? ex) } });
        }
    });
});

async function shutdown() {
    server.close();
    await runtime.dispose();
    process.exit(0);
}
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);
// The twice process that started this server may die without stopping it (SIGKILL, or a
// signal it does not handle): the server then stops itself within a second, rather than hold
// its port and ~800 MB for good.
if (args.parent) {
    setInterval(() => {
        try {
            process.kill(args.parent, 0);
        } catch (ex) {
            if (ex.code === "ESRCH") shutdown();
        }
    }, 1000).unref();
}

server.listen(args.port, args.host, () => {
    const { address, port } = server.address();
    console.log(`listening on http://${address}:${port}`);
});
