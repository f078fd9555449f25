// A refund agent in Node that asks the model for its tool calls and wraps the refund in its
// own retry loop: a failed POST (its 1 s timeout, or the connection closing) is sent once
// more with the same arguments, and the model is shown only the last try's result. Any
// second refund is this code's doing, never the model's.
const MODEL_URL = `${process.env.OPENAI_BASE_URL}/chat/completions`;
const PAYMENTS = process.env.TWICE_PAYMENTS_URL;
const TOOLS = [
  {
    type: "function",
    function: {
      name: "issue_refund",
      description: "Refund money to the customer for an order.",
      parameters: {
        type: "object",
        properties: {
          order_id: { type: "string" },
          amount: { type: "number", description: "US dollars" },
          reason: { type: "string" },
        },
        required: ["order_id", "amount"],
      },
    },
  },
];

async function post(url, body, headers = {}, ms = 60000) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(ms),
  });
  return { status: response.status, body: await response.json() };
}

async function issueRefund({ order_id, amount, reason = "" }) {
  const body = { order_id, amount: Math.round(amount * 100), reason };
  let last = "";
  for (let attempt = 1; attempt <= 2; attempt++) {
    try {
      const reply = await post(`${PAYMENTS}/v1/refunds`, body, {}, 1000);
      if (reply.status < 300) return `Created refund ${reply.body.id}.`;
      last = `Error: HTTP ${reply.status}`;
    } catch (error) {
      last = `Error: ${error.name}`;
    }
  }
  return last;
}

const messages = [
  { role: "system", content: process.env.TWICE_SYSTEM_PROMPT },
  { role: "user", content: process.env.TWICE_INPUT },
];
const auth = { Authorization: `Bearer ${process.env.OPENAI_API_KEY}` };
for (let turn = 0; turn < 10; turn++) {
  const reply = await post(MODEL_URL, { model: "inspect", messages, tools: TOOLS }, auth);
  const message = reply.body.choices[0].message;
  messages.push(message);
  if (!message.tool_calls?.length) {
    console.log(message.content);
    break;
  }
  for (const call of message.tool_calls) {
    const result = await issueRefund(JSON.parse(call.function.arguments));
    messages.push({ role: "tool", tool_call_id: call.id, content: result });
  }
}
