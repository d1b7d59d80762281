"""lit_entropy.data.rendering: prompt templates, chat messages and answer text, against hand-written strings."""

from __future__ import annotations

import pytest

from lit_entropy.data.rendering import PromptRenderer, answer_text, short


class _ChatTokenizer:
    """Renders messages as ``<role>content`` lines plus a generation prompt (what a chat template does)."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        assert tokenize is False and add_generation_prompt is True
        extra = "".join(f"[{k}={v}]" for k, v in sorted(kwargs.items()))
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>" + extra


def test_string_prompts_go_through_the_template_only():
    render = PromptRenderer(None, prompt_template="Q: {prompt} \\boxed{} {prompt}").render
    assert render("1+1", "prompt_key", "q", 0, "here") == "Q: 1+1 \\boxed{} 1+1"
    assert PromptRenderer(None).render("as is", "prompt_key", "q", 0, "here") == "as is"


def test_chat_template_with_system_prompt_and_kwargs():
    renderer = PromptRenderer(
        _ChatTokenizer(), True, "T {prompt}", system_prompt="sys", chat_template_kwargs={"enable_thinking": False}
    )
    assert (
        renderer.render("x", "prompt_key", "q", 0, "here")
        == "<system>sys\n<user>T x\n<assistant>[enable_thinking=False]"
    )
    messages = [{"role": "user", "content": "m", "extra": 1}]  # messages are not templated; extra keys dropped
    assert renderer.render(messages, "prompt_key", "q", 0, "here").startswith("<system>sys\n<user>m\n")


def test_rendering_errors_name_the_setting_row_and_fix():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    with pytest.raises(ValueError, match=r"prompt_key='p' holds chat messages \(row 3 of here\).*'p.0.content'"):
        PromptRenderer(None).render(messages, "prompt_key", "p", 3, "here")
    with pytest.raises(ValueError, match="row 0 of here already starts with a system message"):
        PromptRenderer(_ChatTokenizer(), True, system_prompt="x").render(messages, "prompt_key", "p", 0, "here")
    with pytest.raises(ValueError, match=r"row 1 of here is neither a string nor a list .* 7"):
        PromptRenderer(None).render(7, "prompt_key", "p", 1, "here")


def test_answer_text_and_snippets():
    assert [answer_text(v, "answer_key", "a", 0, "here") for v in ("7", 7, 7.0, 2.5)] == ["7", "7", "7", "2.5"]
    with pytest.raises(ValueError, match="answer_key='a': row 2 of here holds True, not a string or number"):
        answer_text(True, "answer_key", "a", 2, "here")
    assert short("x" * 200) == repr("x" * 200)[:77] + "..." and short("ab") == "'ab'"
