import json, re, sys, collections, os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conversations.json")
raw = open(PATH, "rb").read()
data = json.loads(raw.decode("utf-8"))
errs, warns = [], []
assert data["version"] == 1
convs = data["conversations"]
TRAD = set(
    "們個這來時會說對還與為麼後裡開關車馬門問間題點機電學實體長東從經過讓頭應覺給樣邊見現發麵條"
)
CJK = re.compile(r"[\u4e00-\u9fff]")
LATIN = re.compile(r"[A-Za-z][A-Za-z0-9'_.-]*")


def text_of(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for b in content:
        t = b.get("type")
        if t == "text":
            out.append(b["text"])
        elif t == "tool_use":
            out.append(b["name"] + json.dumps(b["input"], ensure_ascii=False))
        elif t == "tool_result":
            c = b["content"]
            out.append(c if isinstance(c, str) else text_of(c))
    return "".join(out)


def msg_text(m):
    s = text_of(m.get("content"))
    for tc in m.get("tool_calls") or []:
        s += tc["function"]["name"] + tc["function"]["arguments"]
    return s


def size(s):  # rough "units": latin words + CJK chars/1.5
    return len(LATIN.findall(s)) + len(CJK.findall(s)) / 1.5


def is_turn_start(m, schema):
    if m["role"] != "user":
        return False
    if schema == "anthropic.messages" and isinstance(m["content"], list):
        return not all(b.get("type") == "tool_result" for b in m["content"])
    return True


ids = set()
stats = collections.Counter()
dist = []
nturns = []
user_texts = collections.Counter()
all_tool_ids = set()
asst_sizes = {"en": [], "zh": [], "mixed": []}
rows = []
for c in convs:
    cid, lang, schema, body = c["id"], c["lang"], c["schema"], c["body"]

    def E(msg):
        errs.append(f"{cid}: {msg}")

    if cid in ids:
        E("duplicate id")
    ids.add(cid)
    pref = {"en": "en-", "zh": "zh-", "mixed": "mix-"}[lang]
    if not cid.startswith(pref):
        E("bad id prefix")
    if schema not in ("openai.chat", "anthropic.messages"):
        E("bad schema")
    if body.get("model") != "m" or body.get("max_tokens") != 256:
        E("model/max_tokens")
    msgs = body["messages"]
    if msgs[-1]["role"] != "user" or not text_of(msgs[-1]["content"]).strip():
        E("last msg not user text")
    if isinstance(msgs[-1]["content"], list) and any(
        b["type"] != "text" for b in msgs[-1]["content"]
    ):
        E("final has non-text")
    has_tools = False
    if schema == "openai.chat":
        if "system" in body:
            E("openai body has top-level system")
        for i, m in enumerate(msgs):
            if m["role"] == "system" and i != 0:
                E("system not first")
            if m["role"] not in ("system", "user", "assistant", "tool"):
                E("bad role")
        i = 0
        while i < len(msgs):
            m = msgs[i]
            if m["role"] == "assistant" and m.get("tool_calls"):
                has_tools = True
                if m.get("content") is not None:
                    E(f"msg {i} tool_calls with non-null content")
                want = [tc["id"] for tc in m["tool_calls"]]
                for tc in m["tool_calls"]:
                    json.loads(tc["function"]["arguments"])
                    if tc["id"] in all_tool_ids:
                        E("tool id reused")
                    all_tool_ids.add(tc["id"])
                got = []
                j = i + 1
                while j < len(msgs) and msgs[j]["role"] == "tool":
                    got.append(msgs[j]["tool_call_id"])
                    j += 1
                if sorted(got) != sorted(want):
                    E(f"msg {i} tool calls {want} answered by {got}")
                if (
                    j >= len(msgs)
                    or msgs[j]["role"] != "assistant"
                    or not isinstance(msgs[j]["content"], str)
                ):
                    E(f"msg {i} no assistant text after tool results")
                i = j
                continue
            if m["role"] == "tool":
                E(f"orphan tool msg {i}")
            i += 1
        # no two consecutive user/assistant text
        seq = [m["role"] for m in msgs if m["role"] != "system"]
        if seq[0] != "user":
            E("first non-system not user")
    else:
        if not isinstance(body.get("system"), str):
            E("anthropic system missing")
        for i, m in enumerate(msgs):
            want_role = "user" if i % 2 == 0 else "assistant"
            if m["role"] != want_role:
                E(f"alternation broken at {i}")
            if isinstance(m["content"], list):
                for b in m["content"]:
                    if b["type"] not in ("text", "tool_use", "tool_result"):
                        E("bad block")
                    if b["type"] == "tool_use" and m["role"] != "assistant":
                        E("tool_use in user")
                    if b["type"] == "tool_result" and m["role"] != "user":
                        E("tool_result in assistant")
            uses = [
                b["id"]
                for b in (m["content"] if isinstance(m["content"], list) else [])
                if b["type"] == "tool_use"
            ]
            if uses:
                has_tools = True
                for u in uses:
                    if u in all_tool_ids:
                        E("tool id reused")
                    all_tool_ids.add(u)
                nxt = msgs[i + 1]["content"] if i + 1 < len(msgs) else None
                res = (
                    [b["tool_use_id"] for b in nxt]
                    if isinstance(nxt, list) and all(b["type"] == "tool_result" for b in nxt)
                    else None
                )
                if res is None or sorted(res) != sorted(uses):
                    E(f"tool_use at {i} not answered exactly: {res}")
                if (
                    i + 2 >= len(msgs)
                    or msgs[i + 2]["role"] != "assistant"
                    or any(
                        b.get("type") != "text"
                        for b in (
                            msgs[i + 2]["content"]
                            if isinstance(msgs[i + 2]["content"], list)
                            else []
                        )
                    )
                ):
                    E(f"no assistant text after tool_result at {i + 1}")
            if isinstance(m["content"], list) and any(
                b["type"] == "tool_result" for b in m["content"]
            ):
                prev = msgs[i - 1]["content"]
                if not isinstance(prev, list) or not any(b["type"] == "tool_use" for b in prev):
                    E("tool_result without preceding tool_use")
    if bool(body.get("tools")) != has_tools:
        E("tools defs mismatch")
    # turns
    starts = [i for i, m in enumerate(msgs) if is_turn_start(m, schema)]
    final_idx = starts[-1]
    if final_idx != len(msgs) - 1:
        E("final question is not a lone last turn")
    turn_starts = starts[:-1]
    N = len(turn_starts)
    if not 10 <= N <= 24:
        E(f"{N} turns")
    d_msg = c["depends_on"]
    if d_msg not in turn_starts:
        E("depends_on is not a turn start")
        continue
    d = turn_starts.index(d_msg)
    distance = N - d  # turns from dep turn (inclusive) to the final question
    if distance < 5:
        E(f"dep too recent: distance {distance}")
    if not d < 2 * N / 3:
        E(f"dep not in first two-thirds: d={d} N={N}")
    bounds = turn_starts + [final_idx]
    tsizes, dep_tool = [], False
    for k in range(N):
        seg = msgs[bounds[k] : bounds[k + 1]]
        tsizes.append(sum(size(msg_text(m)) for m in seg))
        tool_here = any(
            m.get("tool_calls")
            or m["role"] == "tool"
            or (
                isinstance(m["content"], list)
                and any(b["type"] in ("tool_use",) for b in m["content"])
            )
            for m in seg
        )
        if k == d:
            dep_tool = tool_here
        # assistant answer size (last assistant msg of the turn)
        ans = [m for m in seg if m["role"] == "assistant" and text_of(m["content"]).strip()][-1]
        asst_sizes[lang].append((size(text_of(ans["content"])), cid, k))
        u = text_of(seg[0]["content"])
        user_texts[u] += 1
        nsent = len([s for s in re.split(r"(?<=[.?!。？！])\s*", u) if s.strip()])
        if nsent > 3:
            warns.append(f"{cid} turn {k}: user has {nsent} sentences")
    total = sum(tsizes) + size(text_of(msgs[-1]["content"]))
    share = max(tsizes) / total
    if share > 0.15:
        E(f"max turn share {share:.2%}")
    all_text = "".join(msg_text(m) for m in msgs) + (body.get("system") or "")
    if lang in ("zh", "mixed"):
        bad = sorted(set(ch for ch in all_text if ch in TRAD))
        if bad:
            E(f"traditional chars: {bad}")
        if not CJK.search(text_of(msgs[-1]["content"])):
            E("final question has no Chinese")
    if lang == "en" and CJK.search(all_text):
        E("CJK in en conversation")
    if lang == "mixed" and not LATIN.search(text_of(msgs[-1]["content"])):
        warns.append(f"{cid}: mixed final without latin")
    stats[("lang", lang)] += 1
    stats[("schema", schema)] += 1
    if has_tools:
        stats[("tools", schema)] += 1
    if dep_tool:
        stats[("dep_tool", schema)] += 1
    if schema == "openai.chat" and msgs[0]["role"] != "system":
        stats["openai_no_system"] += 1
    nturns.append(N)
    dist.append(distance)
    rows.append(
        (
            cid,
            lang,
            schema,
            N,
            d,
            distance,
            len(msgs),
            len(json.dumps(c, ensure_ascii=False).encode()),
            f"{share:.1%}",
            "tool" if has_tools else "",
            "DEP-TOOL" if dep_tool else "",
        )
    )

dups = {u: n for u, n in user_texts.items() if n > 1}
if dups:
    warns.append(f"{len(dups)} user messages reused across turns: {list(dups)[:3]}")
print(f"{'id':40} {'lang':5} {'schema':18} N  d  dist msgs bytes  maxshare")
for r in rows:
    print(
        f"{r[0]:40} {r[1]:5} {r[2]:18} {r[3]:<2} {r[4]:<2} {r[5]:<4} {r[6]:<4} {r[7]:<6} {r[8]:6} {r[9]} {r[10]}"
    )
print()
for k, v in sorted(stats.items(), key=str):
    print(k, v)
print("conversations:", len(convs))
print(
    "turns/conv:",
    sorted(collections.Counter(nturns).items()),
    "min",
    min(nturns),
    "max",
    max(nturns),
    "mean %.1f" % (sum(nturns) / len(nturns)),
)
print("dep distance (turns from dep turn to end):", sorted(collections.Counter(dist).items()))
print("dep position d/N:", sorted(round(int(r[4]) / r[3], 2) for r in rows))
for lang, v in asst_sizes.items():
    xs = sorted(s for s, _, _ in v)
    print(
        f"assistant answer size [{lang}] (words or CJK/1.5): min {xs[0]:.0f} p10 {xs[len(xs) // 10]:.0f} median {xs[len(xs) // 2]:.0f} max {xs[-1]:.0f}; smallest: {sorted(v)[:2]}"
    )
print("file bytes:", len(raw))
print("WARNINGS:", *warns, sep="\n  ")
print("ERRORS:", *errs, sep="\n  ")
sys.exit(1 if errs else 0)
