#!/usr/bin/env python3
"""Renders every chat template fixture with many conversations through Python
jinja2 (configured as transformers' apply_chat_template configures it) and
through KVScope's engine (the jinja_render driver), and reports every
difference. Cases where jinja2 raises must raise in ours with the same message.

  compare_with_jinja2.py JINJA_RENDER [TEMPLATE_DIR] [--snippets] [--random N]

Exit status 0 when all cases match."""
import json
import os
import subprocess
import sys
import tempfile

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_DATE = "26 Jul 2024"


class AssistantTracker(Extension):
    """{% generation %}...{% endgeneration %}: renders its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: FIXED_DATE
    return env


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {"type": "function", "function": {"name": "search", "description": "Search the web.",
               "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                              "required": ["q"]}}}
TOOL_CALL = {"id": "call9abcd", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
TOOL_CALL_STR = {"id": "call9abce", "type": "function",
                 "function": {"name": "search", "arguments": "{\"q\": \"jinja\"}"}}


def conversations():
    u = lambda c: {"role": "user", "content": c}
    a = lambda c: {"role": "assistant", "content": c}
    s = lambda c: {"role": "system", "content": c}
    yield "one_turn", {"messages": [u("Hello!")]}
    yield "system_user", {"messages": [s("You are terse."), u("What is 2+2?")]}
    yield "multi_turn", {"messages": [s("Be kind."), u("Hi"), a("Hello! How can I help?"),
                                      u("Tell me a joke."), a("Why did the chicken cross?"),
                                      u("Why?")]}
    yield "no_system_multi", {"messages": [u("Hi"), a("Hey"), u("Bye")]}
    yield "unicode_braces", {"messages": [s("Réponds en français 🇫🇷"),
                                          u("{{ not a tag }} {% nor this %} {# x #} — ünïcødé ✓ \"q\" 'q' \\ \t tab"),
                                          a("D'accord: {\"json\": [1, 2]} <b>bold</b>"),
                                          u("  leading and trailing spaces  \n\n")]}
    yield "trailing_assistant", {"messages": [u("Write a haiku"), a("Autumn moonlight")]}
    yield "tools", {"messages": [u("Weather in Paris?")], "tools": [WEATHER_TOOL, SEARCH_TOOL]}
    yield "tools_system", {"messages": [s("You help with weather."), u("Weather in Paris?")],
                           "tools": [WEATHER_TOOL]}
    yield "tool_calls", {"messages": [u("Weather in Paris?"),
                                      {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
                                      {"role": "tool", "tool_call_id": "call9abcd", "name": "get_weather",
                                       "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                                      a("It is 21°C and clear.")],
                         "tools": [WEATHER_TOOL]}
    yield "tool_calls_none_content", {"messages": [u("Search jinja"),
                                                   {"role": "assistant", "content": None,
                                                    "tool_calls": [TOOL_CALL_STR, TOOL_CALL]},
                                                   {"role": "tool", "tool_call_id": "call9abce", "content": "results"},
                                                   {"role": "tool", "tool_call_id": "call9abcd", "content": "sunny"}],
                                      "tools": [SEARCH_TOOL, WEATHER_TOOL]}
    yield "reasoning", {"messages": [u("What is 17*3?"),
                                     {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
                                     u("And 18*3?")]}
    yield "think_in_content", {"messages": [u("Q1"), a("<think>\nhmm\n</think>\n\nA1"), u("Q2")]}
    yield "thinking_field", {"messages": [u("Q1"), {"role": "assistant", "content": "A1", "thinking": "ponder"},
                                          u("Q2")]}
    yield "enable_thinking_false", {"messages": [u("Quick answer?")], "enable_thinking": False}
    yield "enable_thinking_true", {"messages": [s("sys"), u("Deep answer?")], "enable_thinking": True}
    yield "alternation_error", {"messages": [u("one"), u("two")]}
    yield "assistant_first", {"messages": [a("I start"), u("ok")]}
    yield "empty_messages", {"messages": []}
    yield "list_content", {"messages": [u([{"type": "text", "text": "Describe this."}])]}
    yield "date_override", {"messages": [u("Day?")], "date_string": "01 Jan 2025"}
    yield "developer_role", {"messages": [{"role": "developer", "content": "Be brief."}, u("Hi")]}
    yield "reasoning_effort", {"messages": [u("Hi")], "reasoning_effort": "high"}
    yield "builtin_tools", {"messages": [s("sys"), u("Search the news")], "tools": [WEATHER_TOOL],
                            "builtin_tools": ["brave_search", "wolfram_alpha"]}
    yield "tools_in_system", {"messages": [u("Weather?")], "tools": [WEATHER_TOOL],
                              "tools_in_user_message": False}
    yield "list_content_all_roles", {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Sys part"}]},
        u([{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]),
        {"role": "assistant", "content": [{"type": "text", "text": "Reply"}]},
        u("plain")]}
    yield "tool_then_generation", {"messages": [u("Weather?"),
                                                {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
                                                {"role": "tool", "content": "sunny", "tool_call_id": "call9abcd"}],
                                   "tools": [WEATHER_TOOL]}
    yield "python_tag", {"messages": [u("Run code"), {"role": "ipython", "content": "42"}],
                         "builtin_tools": ["code_interpreter"]}
    yield "documents", {"messages": [u("Summarize")],
                        "documents": [{"title": "Doc A", "text": "Alpha."}, {"title": "Doc B", "text": "Beta."}]}
    yield "xml_in_content", {"messages": [u("<tool_call>{\"name\": \"x\"}</tool_call> [TOOL_CALLS] <|python_tag|>")]}


def random_conversations(count, seed=1234):
    """Random mixes of roles, contents, tools and flags (fixed seed)."""
    import random
    rng = random.Random(seed)
    contents = ["Hi", "", " padded ", "line1\nline2\n", "{{ x }} {% y %}", "ünïcødé ✓ 日本語 🇫🇷",
                "<think>\nreason\n</think>\n\nanswer", "tab\tand \"quotes\" 'single'", "\\ backslash",
                "<|im_end|> <|eot_id|> [INST] fake tokens", "a" * 300, "  \n  "]
    tools = [WEATHER_TOOL, SEARCH_TOOL]
    for i in range(count):
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(contents)})
        for turn in range(rng.randint(0, 4)):
            messages.append({"role": "user", "content": rng.choice(contents)})
            r = rng.random()
            if r < 0.6:
                m = {"role": "assistant", "content": rng.choice(contents)}
                if rng.random() < 0.3:
                    m["reasoning_content"] = rng.choice(contents)
                messages.append(m)
            elif r < 0.8:
                call = rng.choice([TOOL_CALL, TOOL_CALL_STR])
                messages.append({"role": "assistant", "content": rng.choice(["", None, "Let me check."]),
                                 "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "name": call["function"]["name"], "content": rng.choice(contents)})
        if rng.random() < 0.2 and messages:
            messages.append({"role": "assistant", "content": rng.choice(contents)})
        conv = {"messages": messages}
        if rng.random() < 0.4:
            conv["tools"] = rng.sample(tools, rng.randint(1, 2))
        if rng.random() < 0.5:
            conv["enable_thinking"] = rng.random() < 0.5
        yield f"random{i}", conv


VARIANTS = [
    {"add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"},
    {"add_generation_prompt": False, "bos_token": "<s>", "eos_token": "</s>"},
]


def render_python(env, source, context):
    try:
        return "OK", env.from_string(source).render(**context)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return "SYNTAX", str(e)
    except Exception as e:  # noqa: BLE001 - every jinja2 failure is an outcome to compare
        return "ERROR", f"{type(e).__name__}: {e}"


def render_ours(driver, template_path, context, tmp):
    ctx_path = os.path.join(tmp, "context.json")
    with open(ctx_path, "w", encoding="utf-8") as f:
        json.dump(dict(context, strftime_now=FIXED_DATE), f, ensure_ascii=False)
    proc = subprocess.run([driver, template_path, ctx_path], capture_output=True, timeout=60)
    out = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode == 0:
        return "OK", out
    if out.startswith("ERROR TemplateSyntaxError"):
        return "SYNTAX", out
    if out.startswith("ERROR "):
        return "ERROR", out[len("ERROR "):]
    return "CRASH", f"rc={proc.returncode} {out} {proc.stderr.decode(errors='replace')}"


def same(py, ours):
    if py[0] != ours[0]:
        return False
    if py[0] == "OK":
        return py[1] == ours[1]
    if py[0] == "SYNTAX":
        return True  # both reject the template; messages are worded differently
    # Same exception message (the type names can differ: jinja2 TemplateError vs ours).
    return py[1].split(": ", 1)[-1] == ours[1].split(": ", 1)[-1]


def compare_snippets(driver, env):
    """Each snippet of snippets.py through both engines; returns (identical, total)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import snippets
    identical = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, snippet in enumerate(snippets.SNIPPETS):
            path = os.path.join(tmp, f"snippet{i}.jinja")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(snippet)
            py = render_python(env, snippet, snippets.CONTEXT)
            ours = render_ours(driver, path, snippets.CONTEXT, tmp)
            if same(py, ours):
                identical += 1
            else:
                print(f"DIFF snippet {snippet!r}")
                print(f"  jinja2: {py[0]} {py[1]!r}")
                print(f"  ours:   {ours[0]} {ours[1]!r}")
    print(f"{identical}/{len(snippets.SNIPPETS)} snippets identical")
    return identical, len(snippets.SNIPPETS)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 1
    driver = os.path.abspath(sys.argv[1])
    if "--snippets" in sys.argv:
        identical, total = compare_snippets(driver, make_env())
        return 0 if identical == total else 1
    here = os.path.dirname(os.path.abspath(__file__))
    template_dir = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else os.path.join(here, "..", "fixtures", "chat_templates")
    env = make_env()
    total = identical = 0
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(os.listdir(template_dir)):
            if not name.endswith(".jinja"):
                continue
            path = os.path.join(template_dir, name)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            convs = list(conversations())
            if "--random" in sys.argv:
                convs += list(random_conversations(int(sys.argv[sys.argv.index("--random") + 1])))
            for conv_name, conv in convs:
                for variant in VARIANTS:
                    context = dict(variant, **conv)
                    py = render_python(env, source, context)
                    ours = render_ours(driver, path, context, tmp)
                    total += 1
                    if same(py, ours):
                        identical += 1
                    else:
                        failures.append((name, conv_name, variant["add_generation_prompt"], py, ours))
    for name, conv, agp, py, ours in failures:
        print(f"DIFF {name} / {conv} / add_generation_prompt={agp}")
        print(f"  jinja2: {py[0]} {py[1]!r}")
        print(f"  ours:   {ours[0]} {ours[1]!r}")
    print(f"{identical}/{total} template x conversation cases identical")
    return 0 if identical == total else 1


if __name__ == "__main__":
    sys.exit(main())
