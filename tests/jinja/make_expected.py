#!/usr/bin/env python3
"""Regenerates the expectations test_jinja.cpp checks, from Python jinja2
configured as transformers configures it (compare_with_jinja2.make_env):

  tests/fixtures/chat_templates/expected_renders.json  each fixture template
      rendered with a few conversations ({"template", "context", "output"} or
      {"template", "context", "error"})
  stdout: the C++ table of snippets.py's expected outputs, for test_jinja.cpp
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_with_jinja2 as cmp  # noqa: E402
import snippets  # noqa: E402

FIXTURE_CASES = [("multi_turn", True), ("tool_calls", False), ("reasoning", True),
                 ("unicode_braces", True), ("alternation_error", True)]


def cpp_raw(s):
    """A C++ string literal of s (UTF-8 kept, control characters escaped)."""
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\%03o" % ord(ch))
        elif ch == "?":
            out.append("\\?")  # no trigraphs
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def main():
    env = cmp.make_env()
    template_dir = os.path.join(HERE, "..", "fixtures", "chat_templates")
    convs = dict(cmp.conversations())
    cases = []
    for name in sorted(os.listdir(template_dir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(template_dir, name), encoding="utf-8") as f:
            source = f.read()
        for conv, agp in FIXTURE_CASES:
            context = dict(convs[conv], add_generation_prompt=agp, bos_token="<s>",
                           eos_token="</s>")
            kind, text = cmp.render_python(env, source, context)
            case = {"template": name, "conversation": conv, "context": context}
            if kind == "OK":
                case["output"] = text
            else:
                case["error"] = text.split(": ", 1)[-1]
            cases.append(case)
    out = os.path.join(template_dir, "expected_renders.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for group, items in snippets.GROUPS:
        print(f"TEST_CASE(\"jinja: {group} (as python jinja2 renders)\") {{")
        print("  check_snippets({")
        for snippet in items:
            kind, text = cmp.render_python(env, snippet, snippets.CONTEXT)
            if kind == "OK":
                print(f"      {{{cpp_raw(snippet)}, {cpp_raw(text)}, false}},")
            else:
                print(f"      {{{cpp_raw(snippet)}, {cpp_raw(text.split(': ', 1)[-1])}, true}},")
        print("  });")
        print("}")
        print()
    print("// context: " + json.dumps(snippets.CONTEXT, ensure_ascii=False))


if __name__ == "__main__":
    main()
