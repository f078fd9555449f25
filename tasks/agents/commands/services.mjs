// The command agents' tools: plain async functions over a trial's services, with fetch.
//
// The JavaScript twin of tasks/agents/_apis.py: the same tool names, arguments, descriptions
// and result texts as twice's own tools (tasks/_interfaces.py), so the stub models' plans drive
// these agents too and every agent offers a model the same tools. Nothing here retries, sends
// an idempotency key or softens an error: a timeout or a closed connection is thrown as the
// error fetch raised, and a reply that is not 2xx as an Error naming its status. What the model
// (or the framework) does about it is the agent's own behaviour. Each agent.mjs wraps these in
// its framework's tool helper, with the schemas below in that framework's own terms.

// A lost reply is held open until the client gives up: a short read timeout keeps a trial
// cheap (docs/guides/any-language.md, "Keep the agent's own timeout short").
const TIMEOUT_MS = Number(process.env.TWICE_TOOL_TIMEOUT_MS ?? 2000);

async function call(method, url, body) {
  const response = await fetch(url, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(TIMEOUT_MS),
  });
  if (!response.ok) {
    const text = await response.text();
    throw new Error(`HTTP ${response.status} ${response.statusText} from ${method} ${url}: ${text}`);
  }
  return response.json();
}

const get = (url, params = {}) => call("GET", `${url}?${new URLSearchParams(params)}`);
const post = (url, body) => call("POST", url, body);

export const dollars = (cents) => `$${(cents / 100).toFixed(2)}`;

const describeRefund = (r) =>
  `refund ${r.id} of ${dollars(r.amount)} on order ${r.order_id} (status ${r.status})`;
const describeOrder = (o) =>
  `Order ${o.order_id} for ${o.customer}: paid ${dollars(o.amount)}, refunded so far ` +
  `${dollars(o.amount_refunded)}. Items: ` +
  `${(o.items ?? []).map((i) => `${i.name} ${dollars(i.amount)}`).join(", ")}.`;
const describeEmail = (m) => `email ${m.id} to ${m.to} with subject ${JSON.stringify(m.subject)}`;
const describeTicket = (t) =>
  `ticket ${t.id} for ${t.customer_id}: ${JSON.stringify(t.subject)} ` +
  `(${t.status}, ${t.priority} priority)`;
const describeCustomer = (c) =>
  `Customer ${c.customer_id}: ${c.name} <${c.email ?? ""}>, plan ${c.plan ?? "unknown"}. ` +
  `Open tickets: ${c.open_tickets.join(", ") || "none"}.`;

// Each tool: name, description, parameters (name -> {type, description, optional, enum}), run.
function refundTools(base) {
  const orderId = { type: "string", description: 'The order to look up, e.g. "order_1042".' };
  return [
    {
      name: "issue_refund",
      description: "Refund money to the customer for an order. This moves real money.",
      parameters: {
        order_id: { type: "string", description: 'The order to refund, e.g. "order_1042".' },
        amount: { type: "number", description: "Amount to refund in US dollars, e.g. 4.99." },
        reason: {
          type: "string",
          description: "Short reason for the refund, shown to the customer.",
          optional: true,
        },
      },
      async run({ order_id, amount, reason = "" }) {
        const payload = { order_id, amount: Math.round(amount * 100), reason };
        return `Created ${describeRefund(await post(`${base}/v1/refunds`, payload))}.`;
      },
    },
    {
      name: "find_refunds",
      description: "List the refunds already made on an order. Read-only and safe to call any time.",
      parameters: { order_id: orderId },
      async run({ order_id }) {
        const found = await get(`${base}/v1/refunds`, { order_id });
        if (!found.data.length) return `No refunds found for order ${order_id}.`;
        return `${found.data.length} refund(s) on order ${order_id}: ${found.data.map(describeRefund).join("; ")}`;
      },
    },
    {
      name: "get_order",
      description:
        "Look up an order: customer, amount paid, items, and how much was refunded so far.",
      parameters: { order_id: orderId },
      async run({ order_id }) {
        return describeOrder(await get(`${base}/v1/orders/${encodeURIComponent(order_id)}`));
      },
    },
  ];
}

function emailTools(base) {
  return [
    {
      name: "send_email",
      description: "Send an email to a customer. This really sends it: an email cannot be unsent.",
      parameters: {
        to: { type: "string", description: 'The recipient\'s email address, e.g. "dana.ortiz@example.com".' },
        subject: { type: "string", description: "The subject line." },
        body: { type: "string", description: "The plain-text message body." },
      },
      async run({ to, subject, body }) {
        return `Sent ${describeEmail(await post(`${base}/v1/messages`, { to, subject, body }))}.`;
      },
    },
    {
      name: "find_sent_emails",
      description: "Search the sent folder. Read-only and safe to call any time.",
      parameters: {
        to: { type: "string", description: "The recipient's email address." },
        subject: {
          type: "string",
          description: "Optional text the subject contains (case-insensitive).",
          optional: true,
        },
      },
      async run({ to, subject = "" }) {
        const found = await get(`${base}/v1/messages`, subject ? { to, subject } : { to });
        if (!found.data.length) return `No sent emails to ${to}.`;
        return `${found.data.length} sent email(s) to ${to}: ${found.data.map(describeEmail).join("; ")}`;
      },
    },
  ];
}

function ticketTools(base) {
  const customerId = { type: "string", description: 'The customer, e.g. "cus_1042".' };
  return [
    {
      name: "create_ticket",
      description: "Open a new support ticket for a customer. Each call opens a new ticket.",
      parameters: {
        customer_id: customerId,
        subject: { type: "string", description: "One-line summary of the problem." },
        description: { type: "string", description: "What happened, in a few sentences." },
        priority: {
          type: "string",
          enum: ["low", "normal", "high", "urgent"],
          description: "How urgent the problem is.",
          optional: true,
        },
      },
      async run({ customer_id, subject, description, priority = "normal" }) {
        const payload = { customer_id, subject, description, priority };
        return `Opened ${describeTicket(await post(`${base}/v1/tickets`, payload))}.`;
      },
    },
    {
      name: "find_tickets",
      description: "List a customer's tickets. Read-only and safe to call any time.",
      parameters: {
        customer_id: customerId,
        subject: {
          type: "string",
          description: "Optional text the subject contains (case-insensitive).",
          optional: true,
        },
      },
      async run({ customer_id, subject = "" }) {
        const found = await get(`${base}/v1/tickets`, { customer_id, ...(subject ? { subject } : {}) });
        if (!found.data.length) return `No tickets for ${customer_id}.`;
        return `${found.data.length} ticket(s) for ${customer_id}: ${found.data.map(describeTicket).join("; ")}`;
      },
    },
    {
      name: "get_customer",
      description: "Look up a customer: name, email, plan and open tickets.",
      parameters: { customer_id: customerId },
      async run({ customer_id }) {
        return describeCustomer(await get(`${base}/v1/customers/${encodeURIComponent(customer_id)}`));
      },
    },
  ];
}

const BY_SERVICE = { PAYMENTS: refundTools, EMAIL: emailTools, TICKETS: ticketTools };

/** The tools of the trial's services (twice sets TWICE_<SERVICE>_URL for each). */
export function serviceTools(env = process.env) {
  const tools = Object.entries(BY_SERVICE).flatMap(([service, make]) => {
    const url = env[`TWICE_${service}_URL`];
    return url ? make(url) : [];
  });
  if (!tools.length) {
    const known = Object.keys(BY_SERVICE).map((s) => `TWICE_${s}_URL`).join(", ");
    throw new Error(`no service this agent has tools for: set one of ${known}`);
  }
  return tools;
}

/** A tool's parameters as a zod object schema (the frameworks here all take zod). */
export function zodSchema(z, parameters) {
  const shape = {};
  for (const [name, p] of Object.entries(parameters)) {
    let field = p.enum ? z.enum(p.enum) : p.type === "number" ? z.number() : z.string();
    field = field.describe(p.description);
    shape[name] = p.optional ? field.optional() : field;
  }
  return z.object(shape);
}

/** A tool's parameters as a JSON schema object (for a framework that takes one). */
export function jsonSchema(parameters) {
  const properties = {};
  for (const [name, p] of Object.entries(parameters)) {
    properties[name] = {
      type: p.type,
      description: p.description,
      ...(p.enum ? { enum: p.enum } : {}),
    };
  }
  const required = Object.keys(parameters).filter((name) => !parameters[name].optional);
  return { type: "object", properties, required, additionalProperties: false };
}

/** What the agent is given: the system prompt, the user's request and the model endpoint. */
export const trial = {
  system: process.env.TWICE_SYSTEM_PROMPT ?? "",
  input: process.env.TWICE_INPUT ?? "",
  baseURL: process.env.OPENAI_BASE_URL,
  apiKey: process.env.OPENAI_API_KEY,
  model: process.env.OPENAI_MODEL ?? "inspect",
};
