// A twice command agent on the OpenAI Agents SDK for JavaScript, written as its docs write
// one: an Agent with tools, run once, against an OpenAI-compatible endpoint.
//
// The endpoint speaks Chat Completions (the SDK's default is the Responses API) and tracing
// is off (it would export to OpenAI). A tool that throws is handled by the SDK's default
// errorFunction: the model is told "An error occurred while running the tool. Please try
// again." and never the error itself. Nothing in the SDK retries a tool.
import {
  Agent,
  run,
  setDefaultOpenAIClient,
  setOpenAIAPI,
  setTracingDisabled,
  tool,
} from "@openai/agents";
import OpenAI from "openai";
import { jsonSchema, serviceTools, trial } from "../services.mjs";

setDefaultOpenAIClient(new OpenAI({ baseURL: trial.baseURL, apiKey: trial.apiKey }));
setOpenAIAPI("chat_completions");
setTracingDisabled(true);

const agent = new Agent({
  name: "Support agent",
  instructions: trial.system,
  model: trial.model,
  tools: serviceTools().map((t) =>
    tool({
      name: t.name,
      description: t.description,
      // A JSON schema, not zod: the SDK takes zod only in strict mode, where every argument
      // is required and an optional one (a refund's reason) must be sent as null.
      parameters: jsonSchema(t.parameters),
      strict: false,
      execute: t.run,
    }),
  ),
});

const result = await run(agent, trial.input, { maxTurns: 20 });
console.log(result.finalOutput);
