import hashlib, json, importlib, sys, os

sys.path.insert(0, os.path.dirname(__file__))
from tooldefs import TOOLS

MODULES = ["en_a", "en_b", "zh_a", "zh_b", "mix_a"]
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conversations.json")
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _rid(seed, n):
    h = hashlib.sha256(seed.encode()).digest()
    return "".join(ALNUM[b % len(ALNUM)] for b in h[:n])


def _tooldefs(names, schema):
    out = []
    for name in names:
        desc, params = TOOLS[name]
        if schema == "openai.chat":
            out.append(
                {
                    "type": "function",
                    "function": {"name": name, "description": desc, "parameters": params},
                }
            )
        else:
            out.append({"name": name, "description": desc, "input_schema": params})
    return out


def build(c):
    schema, msgs = c["schema"], []
    used_tools = []
    dep_index = None
    ant = schema == "anthropic.messages"
    if not ant and c["system"]:
        msgs.append({"role": "system", "content": c["system"]})
    for i, t in enumerate(c["turns"]):
        if i == c["dep"]:
            dep_index = len(msgs)
        if ant and c["blocks"] and i % 3 == 1:
            msgs.append({"role": "user", "content": [{"type": "text", "text": t["user"]}]})
        else:
            msgs.append({"role": "user", "content": t["user"]})
        if t["kind"] == "tool":
            if ant:
                pre = t["pre"] or ("我查一下。" if c["lang"] == "zh" else "Let me check that.")
                content = [{"type": "text", "text": pre}]
                results = []
                for k, (name, args, res) in enumerate(t["calls"]):
                    tid = "toolu_01" + _rid(f"{c['id']}/{i}/{k}", 22)
                    content.append({"type": "tool_use", "id": tid, "name": name, "input": args})
                    results.append({"type": "tool_result", "tool_use_id": tid, "content": res})
                    used_tools.append(name)
                msgs.append({"role": "assistant", "content": content})
                msgs.append({"role": "user", "content": results})
            else:
                calls, results = [], []
                for k, (name, args, res) in enumerate(t["calls"]):
                    cid = "call_" + _rid(f"{c['id']}/{i}/{k}", 24)
                    calls.append(
                        {
                            "id": cid,
                            "type": "function",
                            "function": {
                                "name": name,
                                "arguments": json.dumps(args, ensure_ascii=False),
                            },
                        }
                    )
                    results.append({"role": "tool", "tool_call_id": cid, "content": res})
                    used_tools.append(name)
                msgs.append({"role": "assistant", "content": t["pre"], "tool_calls": calls})
                msgs.extend(results)
            ans = t["answer"]
        else:
            ans = t["assistant"]
        if ant and c["blocks"] and i % 2 == 0:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": ans}]})
        else:
            msgs.append({"role": "assistant", "content": ans})
    if ant and c["blocks"]:
        msgs.append({"role": "user", "content": [{"type": "text", "text": c["final"]}]})
    else:
        msgs.append({"role": "user", "content": c["final"]})
    body = {"model": "m", "max_tokens": 256}
    if ant and c["system"]:
        body["system"] = c["system"]
    body["messages"] = msgs
    names = []
    for n in list(c["tools"]) + used_tools:
        if n not in names:
            names.append(n)
    if names:
        body["tools"] = _tooldefs(names, schema)
    return {
        "id": c["id"],
        "lang": c["lang"],
        "schema": schema,
        "body": body,
        "depends_on": dep_index,
        "note": c["note"],
    }


def main():
    convos = []
    for m in MODULES:
        try:
            mod = importlib.import_module(m)
        except ModuleNotFoundError as e:
            if e.name == m:
                print("skip", m)
                continue
            raise
        convos.extend(build(c) for c in mod.CONVOS)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"version": 1, "conversations": convos}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", len(convos), "conversations to", OUT)


if __name__ == "__main__":
    main()
