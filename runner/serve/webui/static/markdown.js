// Markdown to DOM nodes, for model output (untrusted). Every node is made with createElement and
// every text set with textContent: no HTML is ever parsed, so a <script>, an <img onerror=...> or an
// SVG in an answer is shown as the text it is. Links keep http(s) and mailto targets only.
// Covers what answers use: headings, paragraphs, lists (nested), block quotes, fenced code (with a
// small highlighter and a copy button), tables, rules, inline code, bold, italics, strike, links.
"use strict";
(function () {
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  };

  const SAFE_URL = /^(https?:\/\/|mailto:)/i;

  // -- inline --------------------------------------------------------------------------------
  const INLINE = [
    { re: /^`([^`\n]+)`/, make: (m) => el("code", null, m[1]) },
    { re: /^\*\*(?=\S)([\s\S]*?\S)\*\*/, make: (m) => wrap("strong", m[1]) },
    { re: /^__(?=\S)([\s\S]*?\S)__/, make: (m) => wrap("strong", m[1]) },
    { re: /^~~(?=\S)([\s\S]*?\S)~~/, make: (m) => wrap("del", m[1]) },
    { re: /^\*(?=\S)([^*\n]*?\S)\*/, make: (m) => wrap("em", m[1]) },
    { re: /^_(?=\S)([^_\n]*?\S)_(?!\w)/, make: (m) => wrap("em", m[1]) },
    { re: /^\[([^\]\n]+)\]\(([^)\s]+)(?:\s+"[^"]*")?\)/, make: (m) => link(m[1], m[2]) },
    { re: /^<(https?:\/\/[^>\s]+)>/, make: (m) => link(m[1], m[1]) },
    { re: /^https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"]/, make: (m) => link(m[0], m[0]) },
  ];

  function wrap(tag, text) {
    const node = el(tag);
    node.append(inline(text));
    return node;
  }

  function link(text, url) {
    if (!SAFE_URL.test(url)) return document.createTextNode(text); // javascript:, data: ... as text
    const a = el("a");
    a.href = url;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    a.append(inline(text));
    return a;
  }

  function inline(text) {
    const out = document.createDocumentFragment();
    let plain = "";
    let i = 0;
    while (i < text.length) {
      const rest = text.slice(i);
      const at = i === 0 || /[\s(*_~[]/.test(text[i - 1]);
      let hit = null;
      if ("`*_~[<h".includes(text[i])) {
        for (const rule of INLINE) {
          if (rule.re.source.startsWith("^_") && !at) continue; // snake_case is not emphasis
          const m = rule.re.exec(rest);
          if (m) { hit = { m, rule }; break; }
        }
      }
      if (hit) {
        if (plain) { out.append(document.createTextNode(plain)); plain = ""; }
        out.append(hit.rule.make(hit.m));
        i += hit.m[0].length;
      } else {
        if (text[i] === "\\" && /[\\`*_{}[\]()#+\-.!|~<>]/.test(text[i + 1] || "")) i += 1;
        plain += text[i];
        i += 1;
      }
    }
    if (plain) out.append(document.createTextNode(plain));
    return out;
  }

  // -- code ----------------------------------------------------------------------------------
  const KEYWORDS = new Set((
    "and as assert async await break case catch class const continue def default del do elif else enum " +
    "except export extends false False final finally fn for from func function go if impl import in " +
    "interface is lambda let loop match mod mut new nil None not null or package pass pub raise return " +
    "self static struct super switch this throw true True try type typeof use var void while with yield " +
    "select from where insert update delete create table int float str bool char string echo fi then"
  ).split(" "));
  const TOKEN = /(\/\/[^\n]*|#[^\n]*|--[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?\b|\b0x[0-9a-f]+\b)|([A-Za-z_][\w]*)/gi;
  const HASH_COMMENTS = /^(python|py|sh|bash|shell|zsh|ruby|rb|yaml|yml|toml|r|perl|make|makefile|dockerfile|ini|conf)$/i;
  const DASH_COMMENTS = /^(sql|lua|haskell|hs)$/i;

  function highlight(code, lang) {
    const out = document.createDocumentFragment();
    let last = 0;
    TOKEN.lastIndex = 0;
    for (let m; (m = TOKEN.exec(code)); ) {
      let cls = null;
      if (m[1]) {
        const hash = m[1][0] === "#", dash = m[1].startsWith("--");
        if ((hash && !HASH_COMMENTS.test(lang)) || (dash && !DASH_COMMENTS.test(lang))) {
          TOKEN.lastIndex = m.index + 1; // not a comment here: go on from the next character
          continue;
        }
        cls = "tok-com";
      } else if (m[2]) cls = "tok-str";
      else if (m[3]) cls = "tok-num";
      else if (m[4] && KEYWORDS.has(m[4])) cls = "tok-kw";
      if (!cls) continue;
      if (m.index > last) out.append(document.createTextNode(code.slice(last, m.index)));
      out.append(el("span", cls, m[0]));
      last = m.index + m[0].length;
    }
    if (last < code.length) out.append(document.createTextNode(code.slice(last)));
    return out;
  }

  function copyText(text, button) {
    const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1200); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text, done));
    } else fallbackCopy(text, done);
  }

  function fallbackCopy(text, done) { // plain http on a home network: no Clipboard API there
    const area = el("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    try { document.execCommand("copy"); done(); } finally { area.remove(); }
  }

  function codeBlock(code, lang) {
    const box = el("div", "codeblock");
    const pre = el("pre");
    const inner = el("code");
    inner.dataset.lang = lang;
    inner.append(highlight(code, lang));
    pre.append(inner);
    const copy = el("button", "copy", "Copy");
    copy.type = "button";
    copy.addEventListener("click", () => copyText(code, copy));
    box.append(pre, copy);
    if (lang) box.append(el("span", "lang", lang));
    return box;
  }

  // -- blocks --------------------------------------------------------------------------------
  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const QUOTE = /^\s{0,3}>\s?(.*)$/;
  const TABLE_SEP = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

  function cells(line) {
    let s = line.trim();
    if (s.startsWith("|")) s = s.slice(1);
    if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
    return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
  }

  function table(lines) {
    const t = el("table");
    const head = el("thead"), row = el("tr");
    for (const c of cells(lines[0])) { const th = el("th"); th.append(inline(c)); row.append(th); }
    head.append(row);
    const body = el("tbody");
    for (const line of lines.slice(2)) {
      const tr = el("tr");
      for (const c of cells(line)) { const td = el("td"); td.append(inline(c)); tr.append(td); }
      body.append(tr);
    }
    t.append(head, body);
    return t;
  }

  function list(lines, start) {
    const first = ITEM.exec(lines[start]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const node = el(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
    let i = start, item = null;
    while (i < lines.length) {
      const line = lines[i];
      const m = ITEM.exec(line);
      if (m && m[1].length === indent && /\d/.test(m[2]) === ordered) {
        item = [m[3]];
        node.append(el("li"));
        node.lastChild.lines = item;
        i += 1;
        continue;
      }
      if (line.trim() === "") {
        const next = lines[i + 1];
        if (next === undefined || (!/^\s/.test(next) && !ITEM.test(next))) break;
        item.push("");
        i += 1;
        continue;
      }
      const lead = line.length - line.trimStart().length;
      if (lead > indent) { item.push(line.slice(Math.min(lead, indent + 4))); i += 1; continue; }
      if (m && m[1].length > indent) { item.push(line.slice(indent + 2)); i += 1; continue; }
      if (!m && item && lines[i - 1].trim() !== "") { item.push(line.trim()); i += 1; continue; } // lazy line
      break;
    }
    for (const li of node.children) {
      const text = li.lines.join("\n");
      li.append(text.includes("\n") ? blocks(text, true) : inline(text));
      delete li.lines;
    }
    return [node, i];
  }

  function blocks(text, tight) {
    const out = document.createDocumentFragment();
    const lines = text.replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (line.trim() === "") { i += 1; continue; }
      if ((m = FENCE.exec(line))) {
        const close = new RegExp("^\\s{0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
        const code = [];
        i += 1;
        while (i < lines.length && !close.test(lines[i])) code.push(lines[i++]);
        i += 1; // the closing fence (or the end: a block still streaming)
        out.append(codeBlock(code.join("\n"), m[2].toLowerCase()));
        continue;
      }
      if ((m = HEADING.exec(line))) {
        const h = el("h" + Math.min(6, m[1].length + 1)); // h1 is the page's
        h.append(inline(m[2]));
        out.append(h);
        i += 1;
        continue;
      }
      if (RULE.test(line)) { out.append(el("hr")); i += 1; continue; }
      if (QUOTE.test(line)) {
        const quoted = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) { quoted.push(m[1]); i += 1; }
        const q = el("blockquote");
        q.append(blocks(quoted.join("\n")));
        out.append(q);
        continue;
      }
      if (ITEM.test(line)) {
        const [node, next] = list(lines, i);
        out.append(node);
        i = next;
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
        const rows = [line, lines[i + 1]];
        i += 2;
        while (i < lines.length && lines[i].includes("|") && lines[i].trim() !== "") rows.push(lines[i++]);
        out.append(table(rows));
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() !== "" && !FENCE.test(lines[i]) && !HEADING.test(lines[i]) &&
             !QUOTE.test(lines[i]) && !(para.length && ITEM.test(lines[i])) && !RULE.test(lines[i])) {
        para.push(lines[i].trim());
        i += 1;
      }
      if (!para.length) { para.push(line); i += 1; }
      const p = el(tight ? "div" : "p");
      const joined = para.join("\n");
      const parts = joined.split(/ {2,}\n|\\\n/); // hard line breaks
      parts.forEach((part, n) => { if (n) p.append(el("br")); p.append(inline(part)); });
      out.append(p);
    }
    return out;
  }

  window.RunnerMarkdown = { render: (text) => blocks(text || ""), highlight, inline };
})();
