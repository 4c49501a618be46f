// runner's chat page: the conversations of runner's store (the same `runner chat` and `runner history`
// use), through the server's /runner/v1 conversation API and its OpenAI /v1/models. A turn is posted
// to the server, which answers it through its one generation loop and keeps it: the page only shows.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const KEY = "runner-api-key";
  const API = "/runner/v1";
  const SETTINGS = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "seed", "max_tokens"];

  const state = {
    id: null,            // the conversation shown (null: a new one, not stored until its first turn)
    conversation: null,  // as GET /runner/v1/conversations/ID gave it
    models: [],          // /v1/models' data
    pending: [],         // images for the next message: {url, name}
    streaming: null,     // {controller, conversation}
    editing: false,      // the composer holds the last message, edited
    draft: { system: null, settings: {} }, // a new chat's, sent with its first turn
  };

  // -- the key, and every request ------------------------------------------------------------
  function headers(json) {
    const h = {};
    const key = sessionStorage.getItem(KEY);
    if (key) h.Authorization = "Bearer " + key;
    if (json) h["Content-Type"] = "application/json";
    return h;
  }

  function askKey() {
    return new Promise((resolve) => {
      const box = $("keybox");
      $("key").value = "";
      box.addEventListener("close", () => {
        if ($("key").value) sessionStorage.setItem(KEY, $("key").value.trim());
        resolve();
      }, { once: true });
      box.showModal();
    });
  }

  async function call(path, options = {}) {
    for (let tries = 0; tries < 4; tries++) {
      const init = { ...options, headers: headers(options.body !== undefined) };
      const response = await fetch(path, init);
      if (response.status !== 401) return response;
      sessionStorage.removeItem(KEY);
      await askKey();
    }
    throw new Error("the API key was refused");
  }

  async function json(path, options) {
    const response = await call(path, options);
    if (!response.ok) throw new Error(await problem(response));
    return response.status === 204 ? null : response.json();
  }

  async function problem(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || response.statusText;
    } catch (_) {
      return response.status + " " + response.statusText;
    }
  }

  function say(text) { $("status").textContent = text || ""; }

  // -- models ----------------------------------------------------------------------------------
  async function loadModels() {
    const data = await json("/v1/models");
    state.models = data.data.filter((m) => !(m.meta && m.meta.rerank));
    const pick = $("model");
    const chosen = pick.value;
    pick.replaceChildren();
    for (const m of state.models) {
      const loaded = !m.meta || m.meta.loaded;
      const option = el("option", null, m.id + (loaded ? "" : " (loads on demand)"));
      option.value = m.id;
      pick.append(option);
    }
    if (chosen) pick.value = chosen;
    modelChanged();
  }

  function model() { return state.models.find((m) => m.id === $("model").value); }

  function modelChanged() {
    const m = model();
    const vision = !!(m && m.meta && m.meta.vision);
    $("attach").hidden = !vision;
    $("model-state").textContent = m && m.meta && !m.meta.loaded ? "not loaded: the first answer loads it" : "";
  }

  // -- the list ------------------------------------------------------------------------------
  async function loadList() {
    const data = await json(API + "/conversations");
    const list = $("chats");
    list.replaceChildren();
    for (const c of data.conversations) {
      const item = el("li");
      const button = el("button", null, c.title || "(empty)");
      button.type = "button";
      button.dataset.id = c.id;
      button.title = c.title;
      if (c.id === state.id) button.setAttribute("aria-current", "true");
      const when = new Date(c.updated * 1000).toLocaleString();
      button.append(el("span", "meta", `#${c.id} · ${c.model} · ${c.turns} turn${c.turns === 1 ? "" : "s"} · ${when}`));
      button.addEventListener("click", () => { open(c.id); $("side").classList.remove("open"); });
      item.append(button);
      list.append(item);
    }
  }

  // -- one conversation ----------------------------------------------------------------------
  async function open(id) {
    if (state.streaming) return say("an answer is still coming: stop it first");
    state.id = id;
    state.editing = false;
    history.replaceState(null, "", id ? "#" + id : "#");
    if (id === null) {
      state.conversation = null;
      state.draft = { system: null, settings: {} };
      render();
      loadList().catch(() => {});
      $("input").focus();
      return;
    }
    try {
      state.conversation = await json(`${API}/conversations/${id}`);
    } catch (e) {
      say(e.message);
      return open(null);
    }
    if (state.conversation.served_model) $("model").value = state.conversation.served_model;
    modelChanged();
    render();
    loadList().catch(() => {});
    if (state.conversation.active) follow(id);
  }

  function render() {
    const c = state.conversation;
    $("title").textContent = c ? (c.title || firstWords(c) || `conversation ${c.id}`) : "New chat";
    for (const b of ["rename", "export-md", "export-json", "delete"]) $(b).disabled = !c;
    const log = $("log");
    log.replaceChildren();
    if (!c) return;
    const messages = c.messages;
    const lastUser = messages.map((m) => m.role).lastIndexOf("user");
    messages.forEach((m, n) => log.append(message(m, n === lastUser, n === messages.length - 1)));
    log.scrollTop = log.scrollHeight;
  }

  function firstWords(c) {
    const first = c.messages.find((m) => m.role === "user");
    return first ? first.content.split(/\s+/).slice(0, 8).join(" ") : "";
  }

  function message(m, lastUser, last) {
    const box = el("article", "msg " + m.role);
    if (m.id) box.dataset.id = m.id;
    if (m.interrupted) box.classList.add("interrupted");
    const who = el("div", "who", m.role === "tool" ? `tool ${m.tool || ""}` : m.role === "user" ? "you" : (m.model || "assistant"));
    box.append(who);
    if (m.role === "user") {
      if (m.images && m.images.length) box.append(thumbs(m.images));
      box.append(el("div", "body plain", m.content));
      if (lastUser) who.append(button("Edit", () => edit(m)));
    } else if (m.role === "tool") {
      const fold = el("details", "tool");
      fold.append(el("summary", null, `result of ${m.tool || "a tool"}${m.call_id ? " (" + m.call_id + ")" : ""}`));
      fold.append(el("pre", null, m.content));
      box.append(fold);
    } else {
      if (m.reasoning) box.append(reasoning(m.reasoning));
      const body = el("div", "body");
      body.append(RunnerMarkdown.render(m.content));
      box.append(body);
      for (const call of m.tool_calls || []) {
        const fold = el("details", "tool");
        fold.append(el("summary", null, `calls ${call.name}`));
        fold.append(el("pre", null, JSON.stringify(call.arguments, null, 2)));
        box.append(fold);
      }
      if (m.stats) box.title = statsLine(m.stats);
      if (last) who.append(button("Regenerate", regenerate));
    }
    return box;
  }

  function reasoning(text) {
    const fold = el("details", "reasoning");
    fold.append(el("summary", null, "reasoning"));
    fold.append(el("div", "body", text));
    return fold;
  }

  function statsLine(s) {
    const parts = [];
    if (s.prompt_tokens !== undefined) parts.push(`prompt ${s.prompt_tokens} tokens`);
    if (s.completion_tokens !== undefined) parts.push(`answer ${s.completion_tokens} tokens`);
    if (s.decode_tokens_per_s) parts.push(`${s.decode_tokens_per_s.toFixed(1)} tok/s`);
    if (s.ttft_s !== undefined) parts.push(`TTFT ${(s.ttft_s * 1000).toFixed(0)} ms`);
    if (s.finish_reason) parts.push(`finish: ${s.finish_reason}`);
    return parts.join(" · ");
  }

  function button(text, action) {
    const b = el("button", null, text);
    b.type = "button";
    b.addEventListener("click", action);
    return b;
  }

  function thumbs(images) {
    const box = el("div", "thumbs");
    for (const image of images) {
      const img = el("img");
      img.alt = "an attached image";
      box.append(img);
      if (image.url) img.src = image.url;
      else call(`${API}/images/${image.sha256}`).then((r) => (r.ok ? r.blob() : null)).then((b) => {
        if (b) img.src = URL.createObjectURL(b);
      }).catch(() => {});
    }
    return box;
  }

  // -- a turn ----------------------------------------------------------------------------------
  async function send(action) {
    if (state.streaming) return;
    const text = $("input").value;
    if (action === "send" && !text.trim() && !state.pending.length) return;
    const body = { model: $("model").value, action, content: action === "regenerate" ? "" : text };
    body.images = action === "regenerate" ? [] : state.pending.map((p) => p.url);
    if (state.id === null) {
      body.system = state.draft.system;
      body.settings = state.draft.settings;
    } else body.conversation = state.id;
    const shown = state.conversation ? state.conversation.messages : [];
    let kept = shown;
    if (action !== "send") {
      const lastUser = shown.map((m) => m.role).lastIndexOf("user");
      kept = shown.slice(0, action === "regenerate" ? lastUser + 1 : lastUser);
    }
    const user = action === "regenerate" ? null :
      { role: "user", content: text, images: state.pending.map((p) => ({ url: p.url })) };
    $("input").value = "";
    state.pending = [];
    state.editing = false;
    showAttached();
    if (!state.conversation) state.conversation = { id: null, title: null, messages: [] };
    state.conversation.messages = user ? [...kept, user] : kept;
    render();
    await stream(`${API}/turns`, { method: "POST", body: JSON.stringify(body) }, body);
  }

  async function follow(id) {
    await stream(`${API}/conversations/${id}/live`, { method: "GET" }, null);
  }

  // A tool call waiting for the person's answer (runner serve --mcp): the call, and Allow / Deny /
  // Always; every tab following the turn shows it, and the first answer wins.
  function approval(event, conversation) {
    const box = el("article", "msg approval");
    box.dataset.ask = event.id;
    box.tabIndex = -1;
    box.append(el("div", "who", `tool call: ${event.server}:${event.tool}`));
    box.append(el("p", null, `The model wants to run ${event.tool} (server ${event.server}) with:`));
    box.append(el("pre", null, event.arguments));
    const row = el("div", "row");
    const answer = async (decision) => {
      for (const b of row.querySelectorAll("button")) b.disabled = true;
      try {
        await json(`${API}/conversations/${conversation}/approve`, {
          method: "POST", body: JSON.stringify({ id: event.id, decision }),
        });
      } catch (e) { say(e.message); }
    };
    row.append(button("Allow", () => answer("allow")), button("Deny", () => answer("deny")),
      button(`Always allow ${event.tool} in this chat`, () => answer("always")));
    box.append(row);
    const minutes = Math.round(event.wait_s / 60);
    box.append(el("div", "muted", `Nothing runs until you answer (at most ${minutes} min; Stop ends the turn).`));
    return box;
  }

  function approved(event) {
    const box = document.querySelector(`[data-ask="${CSS.escape(event.id)}"]`);
    if (!box) return;
    const said = { allowed: "allowed: it ran", denied: "denied: it did not run", always: "allowed, and always in this chat" };
    const row = box.querySelector(".row");
    if (row) row.replaceWith(el("p", "decision", said[event.decision] || `not run: ${event.why}`));
  }

  // Reads a turn's JSON lines: start, reasoning and answer pieces, done (the stored answer), end;
  // with tools, each call's approval and answer, and each stored step (message) as it is made.
  async function stream(path, init, body) {
    const controller = new AbortController();
    state.streaming = { controller, conversation: state.id };
    busy(true);
    const m = model();
    say(m && m.meta && !m.meta.loaded ? `loading ${m.id}…` : "");
    const box = el("article", "msg assistant");
    const who = el("div", "who", $("model").value);
    const fold = reasoning("");
    fold.hidden = true;
    const answer = el("div", "body");
    box.append(who, fold, answer);
    let text = "", thought = "", pending = false, painted = false;
    const paint = () => {
      pending = false;
      answer.replaceChildren(RunnerMarkdown.render(text));
      fold.querySelector(".body").textContent = thought;
      fold.hidden = !thought;
      const log = $("log");
      if (log.scrollHeight - log.scrollTop - log.clientHeight < 120) log.scrollTop = log.scrollHeight;
    };
    try {
      const response = await call(path, { ...init, signal: controller.signal });
      if (response.status === 204) return;
      if (!response.ok) throw new Error(await problem(response));
      $("log").append(box);
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffered += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffered.indexOf("\n")) >= 0) {
          const line = buffered.slice(0, cut);
          buffered = buffered.slice(cut + 1);
          if (!line.trim()) continue;
          const event = JSON.parse(line);
          if (event.type === "start") {
            state.id = state.streaming.conversation = event.conversation;
            history.replaceState(null, "", "#" + event.conversation);
            say("");
            loadList().catch(() => {});
          } else if (event.type === "answer") text += event.text;
          else if (event.type === "reasoning") thought += event.text;
          else if (event.type === "error") say(event.message || (event.error && event.error.message));
          else if (event.type === "approval") {
            const ask = approval(event, state.streaming.conversation);
            $("log").insertBefore(ask, box);
            ask.focus();
            ask.scrollIntoView({ block: "nearest" });
          } else if (event.type === "approved") approved(event);
          else if (event.type === "message") { // a step kept: shown as stored; the next answer starts fresh
            const id = event.message.id;
            if (!id || !$("log").querySelector(`[data-id="${id}"]`)) $("log").insertBefore(message(event.message, false, false), box);
            text = "";
            thought = "";
            paint();
          }
          if ((event.type === "answer" || event.type === "reasoning") && !pending) {
            pending = true;
            if (!painted) { painted = true; paint(); } // the first piece at once: no frame's wait
            else requestAnimationFrame(paint); // then at most once a frame, however fast pieces come
          }
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") say(e.message);
      if (body && !state.id) state.conversation = null;
    } finally {
      state.streaming = null;
      busy(false);
    }
    if (state.id !== null) await open(state.id);
    else render();
  }

  function busy(on) {
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("input").setAttribute("aria-busy", on ? "true" : "false");
  }

  async function stop() {
    const s = state.streaming;
    if (!s) return;
    if (s.conversation !== null) {
      await call(`${API}/conversations/${s.conversation}/stop`, { method: "POST", body: "{}" }).catch(() => {});
    } else s.controller.abort(); // not started yet: nothing is decoding
  }

  function regenerate() { send("regenerate"); }

  function edit(m) {
    state.editing = true;
    $("input").value = m.content;
    $("input").focus();
    say("editing your last message: Send replaces it and its answer (Esc: cancel)");
  }

  // -- images ----------------------------------------------------------------------------------
  function attach(files) {
    const m = model();
    if (!(m && m.meta && m.meta.vision)) return say(`${$("model").value} takes no images (served without --mmproj)`);
    for (const file of files) {
      if (!file.type.startsWith("image/")) { say(`${file.name}: not an image`); continue; }
      const reader = new FileReader();
      reader.onload = () => { state.pending.push({ url: reader.result, name: file.name }); showAttached(); };
      reader.readAsDataURL(file);
    }
  }

  function showAttached() {
    const box = $("attached");
    box.replaceChildren();
    state.pending.forEach((p, n) => {
      const fig = el("figure");
      const img = el("img");
      img.src = p.url;
      img.alt = p.name || "image";
      const drop = button("✕", () => { state.pending.splice(n, 1); showAttached(); });
      drop.setAttribute("aria-label", "Remove " + (p.name || "the image"));
      fig.append(img, drop);
      box.append(fig);
    });
  }

  // -- settings, rename, export, delete --------------------------------------------------------
  function showSettings() {
    const form = $("settings-form");
    const c = state.conversation && state.id !== null ? state.conversation : null;
    const settings = c ? c.settings || {} : state.draft.settings;
    form.elements.system.value = (c ? c.system : state.draft.system) || "";
    for (const name of SETTINGS) form.elements[name].value = settings[name] ?? "";
    form.elements.think.value = settings.think === undefined ? "" : String(settings.think);
    $("settings").showModal();
  }

  async function saveSettings() {
    const form = $("settings-form");
    const settings = {};
    for (const name of SETTINGS) {
      const v = form.elements[name].value;
      if (v !== "") settings[name] = Number(v);
    }
    const think = form.elements.think.value;
    if (think) settings.think = think === "true" ? true : think === "false" ? false : think;
    const system = form.elements.system.value || null;
    if (state.id === null) { state.draft = { system, settings }; return; }
    try {
      await json(`${API}/conversations/${state.id}`, { method: "PATCH", body: JSON.stringify({ system, settings }) });
      await open(state.id);
      say("settings saved");
    } catch (e) { say(e.message); }
  }

  async function rename() {
    const c = state.conversation;
    const title = prompt("A name for this conversation", c.title || firstWords(c));
    if (title === null) return;
    try {
      await json(`${API}/conversations/${state.id}`, { method: "PATCH", body: JSON.stringify({ title }) });
      await open(state.id);
    } catch (e) { say(e.message); }
  }

  async function exportAs(format) {
    const response = await call(`${API}/conversations/${state.id}/export?format=${format}`);
    if (!response.ok) return say(await problem(response));
    const url = URL.createObjectURL(await response.blob());
    const a = el("a");
    a.href = url;
    a.download = `conversation-${state.id}.${format}`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  async function remove() {
    if (!confirm(`Delete conversation ${state.id}? runner history will no longer have it.`)) return;
    try {
      await json(`${API}/conversations/${state.id}`, { method: "DELETE" });
      await open(null);
    } catch (e) { say(e.message); }
  }

  // -- wiring ----------------------------------------------------------------------------------
  function wire() {
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(state.editing ? "edit" : "send"); });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(state.editing ? "edit" : "send"); }
      if (e.key === "Escape" && state.editing) { state.editing = false; $("input").value = ""; say(""); }
    });
    $("stop").addEventListener("click", stop);
    document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.streaming) stop(); });
    $("new-chat").addEventListener("click", () => open(null));
    $("model").addEventListener("change", modelChanged);
    $("settings-btn").addEventListener("click", showSettings);
    $("settings").addEventListener("close", () => { if ($("settings").returnValue === "save") saveSettings(); });
    $("rename").addEventListener("click", rename);
    $("export-md").addEventListener("click", () => exportAs("md"));
    $("export-json").addEventListener("click", () => exportAs("json"));
    $("delete").addEventListener("click", remove);
    $("attach").addEventListener("click", () => $("file").click());
    $("file").addEventListener("change", () => { attach($("file").files); $("file").value = ""; });
    $("open-side").addEventListener("click", () => $("side").classList.add("open"));
    $("close-side").addEventListener("click", () => $("side").classList.remove("open"));
    const composer = $("composer");
    composer.addEventListener("dragover", (e) => { e.preventDefault(); composer.classList.add("dragging"); });
    composer.addEventListener("dragleave", () => composer.classList.remove("dragging"));
    composer.addEventListener("drop", (e) => {
      e.preventDefault();
      composer.classList.remove("dragging");
      attach(e.dataTransfer.files);
    });
    $("input").addEventListener("paste", (e) => {
      const files = [...(e.clipboardData ? e.clipboardData.files : [])].filter((f) => f.type.startsWith("image/"));
      if (files.length) { e.preventDefault(); attach(files); }
    });
  }

  async function start() {
    wire();
    try {
      await loadModels();
      await loadList();
    } catch (e) { say(e.message); }
    const id = parseInt(location.hash.slice(1), 10);
    await open(Number.isFinite(id) ? id : null);
    document.body.dataset.ready = "true";
  }

  start();
})();
