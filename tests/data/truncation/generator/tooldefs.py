def _p(props, req=None):
    return {"type": "object", "properties": props, "required": req or list(props)}


S = {"type": "string"}
N = {"type": "number"}
I = {"type": "integer"}

TOOLS = {
    "get_weather": (
        "Get the weather forecast for a city and date.",
        _p({"city": S, "date": S}, ["city"]),
    ),
    "convert_currency": (
        "Convert an amount between currencies at today's rate.",
        _p({"amount": N, "from": S, "to": S}),
    ),
    "run_sql": (
        "Run a read-only SQL statement against the analytics database and return the output.",
        _p({"query": S}),
    ),
    "kubectl": ("Run a read-only kubectl command in the current cluster context.", _p({"args": S})),
    "calc_mortgage": (
        "Compute a fixed-rate mortgage payment.",
        _p({"principal": N, "annual_rate_pct": N, "years": I}),
    ),
    "search_calendar": (
        "Find free time slots in the user's calendar.",
        _p({"date": S, "min_minutes": I}, ["date"]),
    ),
    "search_web": ("Search the web and return short result snippets.", _p({"query": S})),
    "get_stock_quote": ("Get the latest quote for a ticker.", _p({"ticker": S})),
    "query_fund": ("查询基金的净值、收益率和最大回撤。", _p({"code": S})),
    "search_trains": (
        "查询两个城市之间指定日期的高铁/动车车次。",
        _p({"from": S, "to": S, "date": S}),
    ),
    "query_order": ("查询电商订单及物流状态。", _p({"order_id": S})),
    "run_shell": (
        "Run a shell command in the project sandbox and return stdout/stderr.",
        _p({"cmd": S}),
    ),
    "fetch_ci_log": ("Fetch the log summary of a CI job.", _p({"job_id": S})),
    "translate": ("Translate text into the target language.", _p({"text": S, "target": S})),
    "get_exchange_rate": ("查询实时汇率。", _p({"base": S, "quote": S})),
}
