// A twice command agent on LangGraph.js, written as its docs write a tool-calling graph: a
// model node and a ToolNode in a loop (StateGraph over MessagesAnnotation), ChatOpenAI
// pointed at an OpenAI-compatible endpoint.
//
// ToolNode's default handleToolErrors=true turns a tool that throws into a ToolMessage the
// model reads ("Error: <message>\n Please fix your mistakes."). With --retry-policy
// the tools node gets a retryPolicy (the documented per-node retry): LangGraph then re-runs
// the whole node, the same tool calls with the same arguments, on an error its default
// retryOn accepts, before the model sees anything. For that to reach the node, the ToolNode
// raises (handleToolErrors=false), as a node with a retry policy must.
import { tool } from "@langchain/core/tools";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { ChatOpenAI } from "@langchain/openai";
import { z } from "zod";
import { serviceTools, trial, zodSchema } from "../services.mjs";

const retry = process.argv.includes("--retry-policy");

const tools = serviceTools().map((t) =>
  tool(t.run, { name: t.name, description: t.description, schema: zodSchema(z, t.parameters) }),
);
const model = new ChatOpenAI({
  model: trial.model,
  apiKey: trial.apiKey,
  configuration: { baseURL: trial.baseURL },
}).bindTools(tools);

async function callModel(state) {
  return { messages: [await model.invoke(state.messages)] };
}

function next(state) {
  const last = state.messages.at(-1);
  return last.tool_calls?.length ? "tools" : END;
}

const graph = new StateGraph(MessagesAnnotation)
  .addNode("agent", callModel)
  .addNode(
    "tools",
    new ToolNode(tools, { handleToolErrors: !retry }),
    retry ? { retryPolicy: {} } : {},
  )
  .addEdge(START, "agent")
  .addConditionalEdges("agent", next, ["tools", END])
  .addEdge("tools", "agent")
  .compile();

const result = await graph.invoke(
  { messages: [{ role: "system", content: trial.system }, { role: "user", content: trial.input }] },
  { recursionLimit: 40 },
);
console.log(result.messages.at(-1).content);
