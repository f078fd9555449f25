// A twice command agent on the Vercel AI SDK (`ai`), written as its docs write a tool agent:
// generateText with tools and a stop condition, against an OpenAI-compatible endpoint.
//
// stopWhen: generateText stops after one step by default (stepCountIs(1)): the model would
// call the tool and never see its result, error or not. stepCountIs(20), the default of the
// SDK's own ToolLoopAgent, lets the model see each tool's result and decide what to do next.
// A tool that throws becomes a `tool-error` part whose text (error.message) the model reads;
// the SDK retries model calls (maxRetries 2), never a tool.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";
import { serviceTools, trial, zodSchema } from "../services.mjs";

const provider = createOpenAICompatible({
  name: "twice",
  baseURL: trial.baseURL,
  apiKey: trial.apiKey,
});

const tools = Object.fromEntries(
  serviceTools().map((t) => [
    t.name,
    tool({ description: t.description, inputSchema: zodSchema(z, t.parameters), execute: t.run }),
  ]),
);

const { text } = await generateText({
  model: provider(trial.model),
  system: trial.system,
  prompt: trial.input,
  tools,
  stopWhen: stepCountIs(20),
});
console.log(text);
