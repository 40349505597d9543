"""Tiny DSL for the truncation quality set."""


def T(user, assistant):
    return {"kind": "text", "user": user, "assistant": assistant}


def TOOL(user, calls, answer, pre=None):
    """calls: list of (name, args_dict, result_str). One round of (possibly parallel) calls."""
    return {"kind": "tool", "user": user, "calls": calls, "answer": answer, "pre": pre}


def C(id, lang, schema, turns, dep, final, note, system=None, tools=None, blocks=False):
    return {
        "id": id,
        "lang": lang,
        "schema": schema,
        "turns": turns,
        "dep": dep,
        "final": final,
        "note": note,
        "system": system,
        "tools": tools or [],
        "blocks": blocks,
    }
