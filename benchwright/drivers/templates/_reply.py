"""Shared by every builtin scorer template: which part of a model's reply is scored.

Standard library only. A template imports it as ``from benchwright.drivers.templates._reply import (  # inlined by
render()`` ...; :func:`benchwright.drivers.templates.render` replaces that import with this file's code (from its first
``import`` on), so the rendered task_impl.py stays one standalone file, and this stays the one home of the rules.

Reasoning models reply in one of three ways, and only the answer is scored:

* a reasoning block first: ``<think>...</think>answer`` (DeepSeek-R1, Qwen3, QwQ through servers without a reasoning
  parser; also ``<thinking>``); a reply cut off at max_tokens inside an unclosed ``<think>`` has no answer;
* the block's opening tag in the prompt, not the reply (DeepSeek-R1's chat template): ``reasoning</think>answer``;
* the reasoning in a separate field of the message (``reasoning_content`` from DeepSeek, vLLM and Qwen servers,
  ``reasoning`` from OpenRouter): the runner hands it over as ``reply.reasoning``, outside the text, so it is never
  scored; it is kept in the trial's output for the user to read.
"""

import json
import re
import unicodedata

_THINK_OPEN = re.compile(r"\A\s*<(?:think|thinking)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking)>", re.IGNORECASE)
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\r?\n)+")
# An answer in tags, as prompts in the XML style ask for it: "<reasoning>...</reasoning>\n<answer>72</answer>". Only a
# closed element counts, and no element inside another ("I will use <answer> tags. <answer>C</answer>" is C).
_ANSWER_TAG = re.compile(r"<(answer|final_answer)>((?:(?!<(?:answer|final_answer)>).)*?)</\1>",
                         re.IGNORECASE | re.DOTALL)
# A self-correction: "42, no wait, 41", "A... wait, actually C", "Scratch that: 18", "On second thought, B", "Hmm, on
# reflection, B".
# "actually" alone is not one ("The answer is B. Actually, A is a common mistake" keeps B).
_GAP = r"(?:[\s,.:;!\u2026\u2014\u2013]|-(?![\d.$]))*"  # punctuation between words, not a number's minus sign
_CORRECTION = re.compile(r"(?i)(?:\bwait\b\s*[,.!:;\u2014\u2013-]+|\bscratch that\b|\bon second thought\b|"
                         r"\bon (?:further )?reflection\b|"
                         r"\bcorrection\s*:|\bI made a mistake\b|\blet me correct (?:that|myself)\b)"
                         r"(?:" + _GAP + r"(?:no|actually|hmm|sorry)\b)*" + _GAP)

# What a chat model says to the user after its answer, not about it: "Let me know if you'd like me to walk through step
# 2 again!", "Would you like the 2 months separately?", "Hope this helps! \U0001f60a", "If you have more questions, feel
# free to ask." Only an offer or a question back opens one: "If you have 3 boxes of 24, you have 72." is no closing.
_CLOSING = re.compile(r"[\s>*_#-]*(?:let me know|would you like|do you want|want me to|shall i|should i|feel free|"
                      r"(?:i )?hope (?:this|that|it) helps|is there anything else|any (?:other |more )?questions|"
                      r"(?:i'?d|i would|i'?m|i am) (?:be )?(?:happy|glad) to|happy to|i can also|good luck|"
                      r"if you(?:'d| would) like|if you want (?:me|more|another|an? |to )|"
                      r"if you need (?:anything|more|further|help|another|an? )|"
                      r"if you have (?:any |more |other |further |follow-up |additional |\d+ more )?"
                      r"(?:questions?|problems?|doubts?|concerns?))\b|[\W_]*\Z", re.IGNORECASE)
# Where a sentence of the reply starts: the start, a new line, or after a sentence's end.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?\u2026])[ \t]+(?=\S)|\n\s*(?=\S)")

_LATIN_MARKS = re.compile(r"(?<=[a-zA-Z])[\u0300-\u036f]+")  # the accents NFKD splits off a Latin letter


def answer_part(reply, tags=False):
    """The text a template scores: ``reply`` without a leading reasoning block, blank lines before the answer
    dropped (the answer's own indentation kept: code bodies start indented). ``""`` when the reply ended inside its
    reasoning (no answer). With ``tags`` (the templates that read a short answer, not code or calls, which may well
    hold such markup), only the last non-empty ``<answer>...</answer>`` element's content when the reply has one."""
    text = str(reply or "")
    close = _THINK_CLOSE.search(text)
    if close is not None:
        text = text[close.end():]
    elif _THINK_OPEN.match(text):
        return ""
    tagged = [m.group(2) for m in _ANSWER_TAG.finditer(text) if m.group(2).strip()] if tags else []
    if tagged:
        text = tagged[-1]
    return _LEADING_BLANK_LINES.sub("", text).rstrip()


def after_correction(text):
    """The text after the reply's last self-correction marker, or None when it corrects nothing."""
    last = None
    for match in _CORRECTION.finditer(text):
        last = match
    if last is None or not text[last.end():].strip():
        return None
    return text[last.end():]


def without_closing(text):
    """``text`` without the sentences it closes on that talk to the user rather than answer (an offer, a question
    back, "Hope this helps!", an emoji), dropped from the end back to the last sentence that is not one; ``text`` as
    it is when every sentence is one."""
    kept = text.rstrip()
    end = len(kept)
    for start in reversed([0, *(m.end() for m in _SENTENCE_BREAK.finditer(kept))]):
        if not _CLOSING.match(kept, start, end):  # the sentence from ``start`` to ``end``
            return kept[:end].rstrip()
        end = start
    return text


def plain_apostrophes(text):
    """``text`` with its typographic apostrophes (\u2019, \u2018, \u02bc) as ``'``: chat models write "It\u2019s
    Canberra" and "I\u2019d go with B" as often as with a straight one, and the rules spell the straight one."""
    return text.translate(_APOSTROPHES)


_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})


def fold_accents(text):
    """``text`` without a Latin letter's accents and with ligatures and compatibility forms spelled out (NFKD):
    "S\u00e3o Paulo" -> "Sao Paulo", "\ufb01sh" -> "fish". Other scripts keep their marks (Japanese "\u304c" is
    not "\u304b")."""
    return _LATIN_MARKS.sub("", unicodedata.normalize("NFKD", str(text)))


def reasoning_of(reply):
    """The reasoning the provider sent beside the text (``reasoning_content``/``reasoning``), or ``""``."""
    return str(getattr(reply, "reasoning", None) or "")


def boxed(text):
    """The contents of every ``\\boxed{...}`` (and ``\\fbox{...}``) in ``text``, braces balanced, in order."""
    out = []
    for opening in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, j = 1, opening.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            out.append(text[opening.end():j - 1])
    return out


def unlatex(text):
    """``text`` with LaTeX text wrappers unwrapped (``\\text{Paris}`` -> ``Paris``), ``\\frac{a}{b}`` as ``a/b``,
    ``{,}`` as ``,`` and math delimiters and spacing commands dropped."""
    text = str(text)
    if "\\" not in text:  # every rewrite below but the "{,}" one starts at a backslash
        return text.replace("{,}", ",")
    for _ in range(3):  # nested wrappers: \textbf{\text{x}}
        text = re.sub(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"\1/\2", text)
    text = re.sub(r"\\[dt]?frac\s*(\d)\s*(\d)", r"\1/\2", text)
    text = text.replace("{,}", ",").replace("\\%", "%").replace("\\$", "$")
    text = re.sub(r"\\[,;:! ]", "", text)
    text = re.sub(r"\\left|\\right|\\\(|\\\)|\\\[|\\\]", "", text)
    return text


def json_answers(text, keys=("answer", "final_answer", "choice", "option", "letter", "result")):
    """Values under an answer-like key (case-insensitive) of each flat JSON object in ``text``, in order."""
    out = []
    for candidate in re.findall(r"\{[^{}]*\}", text):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            for key, item in value.items():
                if str(key).lower() in keys and isinstance(item, (str, int, float)) and not isinstance(item, bool):
                    out.append(item)
    return out
