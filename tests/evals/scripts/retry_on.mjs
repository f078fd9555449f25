// A refund agent in Node that retries its refund once, only on one kind of failure:
// `node retry_on.mjs timeout` retries only when its own 1 s timeout fires (AbortSignal.timeout),
// `node retry_on.mjs connection` only when the connection closes with no reply (UND_ERR_SOCKET).
// It reads the order and amount from TWICE_INPUT and never asks the model: its retry policy is
// all it is.
const retryOn = process.argv[2];
const input = process.env.TWICE_INPUT;
const order = input.match(/order_\d+/)[0];
const amount = Math.round(Number(input.match(/\$(\d+(?:\.\d+)?)/)[1]) * 100);
const url = `${process.env.TWICE_PAYMENTS_URL}/v1/refunds`;

function kind(error) {
  if (error.name === "TimeoutError") return "timeout";
  const code = error.cause?.code;
  if (code === "UND_ERR_SOCKET" || code === "ECONNRESET") return "connection";
  return "other";
}

for (let attempt = 1; attempt <= 2; attempt++) {
  try {
    const response = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ order_id: order, amount }),
      signal: AbortSignal.timeout(1000),
    });
    console.log(`attempt ${attempt}: HTTP ${response.status} ${await response.text()}`);
    break;
  } catch (error) {
    const seen = kind(error);
    console.log(`attempt ${attempt}: ${seen} (${error.name}: ${error.cause?.code ?? error.message})`);
    if (seen !== retryOn) break;
  }
}
