// hearth's chat page: plain JS, no build step. It talks to the server's OpenAI API (/v1/models,
// /v1/chat/completions with stream: true) and polls /status. Conversations and settings stay in localStorage.
"use strict";

const md = window.markdownit({ html: false, linkify: true }); // html: false escapes raw HTML from the model
const $ = (id) => document.getElementById(id);
const store = {
  load(key, fallback) { try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; } },
  save(key, value) { localStorage.setItem(key, JSON.stringify(value)); },
};

let convs = store.load("hearth.conversations", []);
let currentId = store.load("hearth.current", null);
let settings = store.load("hearth.settings", {});
let apiKey = localStorage.getItem("hearth.apiKey") || "";
let controller = null; // the AbortController of the answer being streamed
let models = [];

class NeedKey extends Error {}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

async function errorMessage(r) {
  try { const body = await r.json(); return body.error?.message || `HTTP ${r.status}`; } catch { return `HTTP ${r.status}`; }
}

async function getJSON(path, ask = true) {
  const r = await fetch(path, { headers: headers() });
  if (r.status === 401) { if (ask) askKey(await errorMessage(r)); throw new NeedKey(); }
  if (!r.ok) throw new Error(await errorMessage(r));
  return r.json();
}

// ---- conversations ----
function current() {
  let conv = convs.find((c) => c.id === currentId);
  if (!conv) conv = newConversation();
  return conv;
}

function newConversation() {
  const conv = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New chat",
                 model: settings.model || null, messages: [] };
  convs.unshift(conv);
  currentId = conv.id;
  persist();
  return conv;
}

function persist() {
  store.save("hearth.conversations", convs);
  store.save("hearth.current", currentId);
}

function renderConversations() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of convs) {
    const li = document.createElement("li");
    li.className = c.id === currentId ? "current" : "";
    const title = document.createElement("span");
    title.textContent = c.title;
    const del = document.createElement("button");
    del.textContent = "×";
    del.title = "delete this conversation";
    del.onclick = (e) => {
      e.stopPropagation();
      convs = convs.filter((x) => x.id !== c.id);
      if (currentId === c.id) currentId = convs[0]?.id ?? null;
      persist();
      renderAll();
    };
    li.append(title, del);
    li.onclick = () => { if (!controller) { currentId = c.id; persist(); renderAll(); } };
    ul.append(li);
  }
}

// ---- messages ----
function renderMarkdown(text) { return md.render(text); }

function fillBody(body, m) {
  if (m.role === "assistant") {
    body.innerHTML = renderMarkdown(m.content);
    for (const pre of body.querySelectorAll("pre")) pre.prepend(button("copy", () => copyText(pre.querySelector("code").textContent)));
  } else body.textContent = m.content;
  if (m.role === "user") body.style.whiteSpace = "pre-wrap";
}

function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text); return; }
  // plain http on a lab network is not a secure context: no Clipboard API there
  const area = document.createElement("textarea");
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

function messageElement(conv, m, i) {
  const div = document.createElement("div");
  div.className = `msg ${m.error && !m.content ? "error" : m.role}`;
  const who = document.createElement("div");
  who.className = "who";
  who.append(m.role === "user" ? "You" : `Assistant${m.model ? " · " + m.model : ""}`);
  const busy = controller !== null;
  if (m.role === "user" && !busy) who.append(button("Edit", () => editMessage(div, conv, i)));
  if (m.role === "assistant" && i === conv.messages.length - 1 && !busy) {
    who.append(button("Regenerate", () => { conv.messages.splice(i); persist(); answer(conv); }));
  }
  const body = document.createElement("div");
  body.className = "body";
  if (m.error && !m.content) body.textContent = m.error;
  else fillBody(body, m);
  div.append(who, body);
  const tokens = m.usage ? `${m.usage.prompt_tokens} prompt + ${m.usage.completion_tokens} answer tokens` : "";
  const note = m.stopped ? "stopped" : m.error && m.content ? `error: ${m.error}` :
    m.finish === "length" ? `cut at max tokens · ${tokens}` : tokens;
  if (note) { const n = document.createElement("div"); n.className = "note"; n.textContent = note; div.append(n); }
  div.dataset.state = m.streaming ? "streaming" : m.stopped ? "stopped" : m.error ? "error" : "done";
  div.dataset.chunks = m.chunks || 0;
  return div;
}

function button(text, onclick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.onclick = onclick;
  return b;
}

function renderMessages() {
  const conv = current();
  const box = $("messages");
  box.replaceChildren(...conv.messages.map((m, i) => messageElement(conv, m, i)));
  box.scrollTop = box.scrollHeight;
}

function editMessage(div, conv, i) {
  const body = div.querySelector(".body");
  const area = document.createElement("textarea");
  area.rows = 4;
  area.value = conv.messages[i].content;
  const save = button("Save & send", () => {
    conv.messages.splice(i); // the answers after an edited question no longer belong to it
    conv.messages.push({ role: "user", content: area.value });
    persist();
    answer(conv);
  });
  save.className = "edit-save";
  body.replaceChildren(area, save, button("Cancel", renderMessages));
  area.focus();
}

function renderAll() {
  renderConversations();
  const conv = current();
  if (conv.model && models.some((m) => m.id === conv.model)) $("model").value = conv.model;
  renderMessages();
}

// ---- settings ----
const FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed"];
function loadSettings() { for (const f of FIELDS) if (settings[f] !== undefined) $(f).value = settings[f]; }
function saveSettings() {
  for (const f of FIELDS) settings[f] = $(f).value;
  settings.model = $("model").value;
  store.save("hearth.settings", settings);
}

function requestBody(conv) {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conv.messages) {
    if (m.role === "assistant" && !m.content) continue; // a failed answer is not part of the conversation
    messages.push({ role: m.role, content: m.content });
  }
  const body = { model: $("model").value || undefined, messages, stream: true,
                 stream_options: { include_usage: true } };
  const num = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  body.temperature = num("temperature");
  body.top_p = num("top_p");
  body.max_tokens = num("max_tokens");
  body.seed = num("seed");
  return body;
}

// ---- streaming an answer ----
function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
  $("model").disabled = busy;
}

async function answer(conv) {
  const reply = { role: "assistant", content: "", model: $("model").value, streaming: true, chunks: 0 };
  conv.messages.push(reply);
  controller = new AbortController();
  setBusy(true);
  renderMessages();
  const el = () => $("messages").lastElementChild;
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    setTimeout(() => {
      pending = false;
      const box = $("messages");
      const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      const div = el();
      fillBody(div.querySelector(".body"), reply);
      div.dataset.chunks = reply.chunks;
      if (atEnd) box.scrollTop = box.scrollHeight;
    }, 40);
  };
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
      body: JSON.stringify(requestBody(conv)), signal: controller.signal });
    if (r.status === 401) { askKey(await errorMessage(r)); throw new Error("this server needs an API key"); }
    if (!r.ok) throw new Error(await errorMessage(r));
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          const obj = JSON.parse(line.slice(6));
          if (obj.error) throw new Error(obj.error.message);
          if (obj.model) reply.model = obj.model; // the model that answered, as the server names it
          const choice = obj.choices?.[0];
          if (choice?.delta?.content) { reply.content += choice.delta.content; reply.chunks++; redraw(); }
          if (choice?.finish_reason) reply.finish = choice.finish_reason;
          if (obj.usage) reply.usage = obj.usage;
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") reply.stopped = true;
    else reply.error = e.message;
  } finally {
    delete reply.streaming;
    controller = null;
    setBusy(false);
    const firstUser = conv.messages.find((m) => m.role === "user");
    if (conv.title === "New chat" && firstUser) conv.title = firstUser.content.slice(0, 40);
    persist();
    renderAll();
  }
}

// ---- API key ----
function askKey(message) {
  const dialog = $("key-dialog");
  $("key-error").textContent = message || "";
  if (!dialog.open) { $("key-input").value = ""; dialog.showModal(); }
}

$("key-form").addEventListener("submit", () => {
  apiKey = $("key-input").value.trim();
  localStorage.setItem("hearth.apiKey", apiKey);
  refreshModels();
});

// ---- models and status ----
async function refreshModels() {
  try {
    const body = await getJSON("/v1/models");
    models = body.data;
  } catch (e) {
    if (!(e instanceof NeedKey)) $("status").textContent = `cannot list models: ${e.message}`;
    return;
  }
  const select = $("model");
  const chosen = current().model || settings.model || select.value;
  select.replaceChildren(...models.map((m) => {
    const o = document.createElement("option");
    o.value = m.id;
    return o;
  }));
  labelModels(models.map((m) => ({ name: m.id, state: m.state })));
  if (models.some((m) => m.id === chosen)) select.value = chosen;
}

function labelModels(states) {
  // "name (unloaded)" / "(loading)": a model of a multi-model server that loads when asked for
  const byName = new Map(states.map((m) => [m.name, m.state]));
  for (const o of $("model").options) {
    const state = byName.get(o.value);
    o.textContent = state && state !== "loaded" ? `${o.value} (${state})` : o.value;
  }
}

function fmtStatus(s) {
  const lines = [`running ${s.num_requests_running} · waiting ${s.num_requests_waiting}`];
  for (const m of s.models) {
    lines.push(`${m.name} (${m.state})`);
    lines.push(`  KV ${(100 * m.kv_cache_usage_perc).toFixed(1)}% (${m.kv_cache_used_blocks}/${m.kv_cache_total_blocks} blocks)`);
    if (m.generation_tokens_per_s !== null) lines.push(`  ${m.generation_tokens_per_s.toFixed(1)} tok/s out`);
  }
  return lines.join("\n");
}

async function pollStatus() {
  try {
    const s = await getJSON("/status", false);
    $("status").textContent = fmtStatus(s);
    labelModels(s.models);
  } catch (e) {
    $("status").textContent = e instanceof NeedKey ? "needs an API key" : `status: ${e.message}`;
  }
}

// ---- wiring ----
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  const conv = current();
  conv.model = $("model").value;
  conv.messages.push({ role: "user", content: text });
  persist();
  answer(conv);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").onclick = () => controller?.abort();
$("new-chat").onclick = () => { if (!controller) { newConversation(); renderAll(); } };
$("change-key").onclick = () => askKey("");
$("model").onchange = () => { current().model = $("model").value; persist(); saveSettings(); };
for (const f of FIELDS) $(f).addEventListener("change", saveSettings);

window.hearth = { renderMarkdown, conversations: () => convs };
loadSettings();
renderAll();
refreshModels().then(renderAll);
pollStatus();
setInterval(pollStatus, 2000);
