#!/usr/bin/env python3
"""Chat templates rendered by `kvscope chat-template` against transformers.

Every template in tests/fixtures/chat_templates (real ones, from the models'
own tokenizer configs) renders every conversation below, with and without the
generation prompt, through `kvscope chat-template` and through transformers'
`render_jinja_template` (what `apply_chat_template(..., tokenize=False)` calls).
The bytes must be identical; a conversation transformers refuses (the template
raises) must exit 2 with the template's own message.

  chat_template_oracle.py KVSCOPE_EXE [--only TEMPLATE_SUBSTRING]
Run with the oracle environment's python (scripts/setup-oracles).
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(os.path.dirname(HERE), "fixtures", "chat_templates")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

TOOL_CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}

# name -> (messages, tools, template variables)
CONVERSATIONS = {
    "one_turn": ([{"role": "user", "content": "What is the capital of France?"}], None, {}),
    "system_user": ([{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Hi!"}], None, {}),
    "multi_turn": ([{"role": "user", "content": "Write a haiku."},
                    {"role": "assistant", "content": "Leaves fall\nquietly."},
                    {"role": "user", "content": "Another one?"}], None, {}),
    "unicode_braces": ([{"role": "user",
                         "content": "Ünïcødé 🍂 — {{ not a tag }} {% raw %} {# x #} 'q' \"dq\" \\n"}],
                       None, {}),
    "tools": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL], {}),
    "tool_calls": ([{"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
                    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                     "content": "{\"temperature\": 21}"},
                    {"role": "assistant", "content": "It is 21 degrees."},
                    {"role": "user", "content": "Thanks."}], [WEATHER_TOOL], {}),
    "trailing_assistant": ([{"role": "user", "content": "Say hi."},
                            {"role": "assistant", "content": "Hi"}], None, {}),
    "reasoning": ([{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
                   {"role": "user", "content": "And 3+3?"}], None, {}),
    "thinking_off": ([{"role": "user", "content": "2+2?"}], None, {"enable_thinking": False}),
    "thinking_on": ([{"role": "user", "content": "2+2?"}], None, {"enable_thinking": True}),
    "not_alternating": ([{"role": "user", "content": "One."},
                         {"role": "user", "content": "Two."}], None, {}),
}

BOS, EOS = "<s>", "</s>"


def oracle(template, messages, tools, variables, generation_prompt):
    try:
        return "ok", render_jinja_template(
            conversations=[messages], tools=tools, chat_template=template,
            add_generation_prompt=generation_prompt, bos_token=BOS, eos_token=EOS,
            **variables)[0][0]
    except Exception as e:  # the template raised (TemplateError) or failed
        return "raise", str(e)


def ours(exe, template_path, messages, tools, variables, generation_prompt, tmp):
    fd, msgs = tempfile.mkstemp(suffix=".json", dir=tmp)
    os.close(fd)
    with open(msgs, "w", encoding="utf-8") as f:
        json.dump({"messages": messages, "tools": tools} if tools else messages, f,
                  ensure_ascii=False)
    cmd = [exe, "chat-template", "--template", template_path, "--messages", msgs,
           "--bos", BOS, "--eos", EOS]
    if not generation_prompt:
        cmd.append("--no-generation-prompt")
    for name, value in variables.items():
        cmd += ["--var", name + "=" + json.dumps(value)]
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode == 0:
        return "ok", r.stdout.decode("utf-8")
    return ("raise" if r.returncode == 2 else "crash %d" % r.returncode), r.stderr.decode(
        "utf-8", "replace")


def check_unread_var(exe, tmp):
    """A --var the template never reads renders anyway, with a warning naming it."""
    path = os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")
    msgs = os.path.join(tmp, "one.json")
    with open(msgs, "w") as f:
        json.dump(CONVERSATIONS["one_turn"][0], f)
    r = subprocess.run([exe, "chat-template", "--template", path, "--messages", msgs,
                        "--var", "enable_thinking=false", "--var", "enable_thiking=false"],
                       capture_output=True, text=True)
    want = "warning: the chat template never reads 'enable_thiking' (%s)" % path
    lines = r.stderr.splitlines()
    if r.returncode == 0 and lines == [want] and r.stdout.endswith("</think>\n\n"):
        return []
    return [("unread --var", ("ok", want), ("exit %d" % r.returncode, r.stderr + r.stdout[-80:]))]


def main():
    exe = sys.argv[1]
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    names = sorted(n for n in os.listdir(TEMPLATES) if n.endswith(".jinja") and only in n)
    assert names, "no templates in " + TEMPLATES
    failures, same, raised = [], 0, 0
    cases = []
    for name in names:
        path = os.path.join(TEMPLATES, name)
        template = open(path, encoding="utf-8").read()
        for conv, (messages, tools, variables) in CONVERSATIONS.items():
            for gp in (True, False):
                case = "%s / %s / %s" % (name, conv, "prompt" if gp else "no prompt")
                cases.append((case, oracle(template, messages, tools, variables, gp),
                              (path, messages, tools, variables, gp)))
    with tempfile.TemporaryDirectory() as tmp:
        # Each call starts the executable (LibTorch's libraries): two at a time.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            gots = list(pool.map(lambda c: ours(exe, *c[2], tmp), cases))
        for (case, want, _), got in zip(cases, gots):
            if want[0] == "ok" and got == want:
                same += 1
            elif want[0] == "raise" and got[0] == "raise" and want[1] in got[1]:
                raised += 1
            else:
                failures.append((case, want, got))
        failures += check_unread_var(exe, tmp)
    for case, want, got in failures:
        print("DIFFERS %s\n  transformers (%s): %r\n  kvscope      (%s): %r" %
              (case, want[0], want[1][:600], got[0], got[1][:600]))
    print("%d templates x %d conversations x 2: %d identical, %d refused with the template's "
          "message, %d differ" % (len(names), len(CONVERSATIONS), same, raised, len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
