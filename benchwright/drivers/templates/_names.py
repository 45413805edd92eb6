"""Shared by the builtin scorer templates that compare names (``exact.py``): what a name looks like in a reply and
which words may stand before one.

Standard library only; inlined by :func:`benchwright.drivers.templates.render` like ``_reply.py`` (from its first
``import`` on), so the rendered task_impl.py stays one standalone file.
"""

import re

# A name: each word capitalised but a name's particles ("Leonardo da Vinci", "Ludwig van Beethoven").
_NAME_WORD = r"(?:[A-Z\u00c0-\u00de][\w'\u2019.-]*|da|de|del|della|di|du|van|von|der|den|le|la|bin|ibn|al|y|of|the)"
_NAME = re.compile(_NAME_WORD + r"(?:\s+" + _NAME_WORD + r")*")
# What may stand before a name that is the answer: "the English novelist Jane Austen", "the planet Mars", "the city of
# Canberra", "the symbol Au"; a denial, a preposition or a conjunction in it makes it something else ("not Canberra",
# "a rival of Jane Austen").
_WHO_SAYS = frozenset(("think", "thinks", "assume", "assumes", "say", "says", "said", "guess", "guesses", "believe",
                       "believes", "suggest", "suggests", "claim", "claims", "mean", "means", "mention", "mentions"))
_NOT_DESCRIPTOR = frozenset(("not", "no", "never", "than", "of", "by", "with", "from", "to", "for", "and", "or",
                             "but", "before", "after", "like", "unlike", "nor", "except", "instead", "rather",
                             "besides", "about", "against", "versus", "vs", "without", "is", "was", "are", "were",
                             "has", "had", "in", "on", "at", "near", "beside", "between", "under", "over", "above",
                             "below", "behind", "beyond", "former", "formerly", "ex", "many", "some", "most",
                             "people", "others", "everyone", "anyone", "someone", "nobody", "pick", "picks", "choose",
                             "chooses")) | _WHO_SAYS  # who says it, not what it is: "Many people assume Sydney."
# A capitalised word that describes the name after it: a title, a kind of place ("General George Washington", "Mount
# Everest"; "New York" does not name York) or a role written first in a short reply ("Novelist Jane Austen.").
_TITLES = frozenset(("president", "general", "king", "queen", "prince", "princess", "emperor", "empress", "sir",
                     "dame", "lord", "lady", "saint", "st", "pope", "dr", "professor", "prof", "captain", "admiral",
                     "chancellor", "senator", "governor", "mount", "mt", "lake", "river", "cape", "isle", "planet",
                     "author", "writer", "novelist", "poet", "playwright", "painter", "artist", "composer", "inventor"))
# A symbol or an abbreviation glossed in brackets, or a name with its symbol: "H (hydrogen)", "Gold (Au)"
_GLOSSED = re.compile(r"\A[\W_]*([^\W\d_]{1,3}|[^\W\d_][^()\n]{2,40}?)[*_]*\s*\(([^()\n]{1,40})\)[\W_]*\Z")
# What a person's possessive names in "Who wrote/painted ...?": "It's Jane Austen's novel."
_WORK = re.compile(r"(?i)\A(.{2,60}?)['\u2019]s\s+(?:(?:most|best|famous|best-known|well-known|classic|own|first|"
                   r"greatest|celebrated)\s+){0,3}(?:novel|book|work|painting|portrait|play|poem|song|opera|symphony|"
                   r"masterpiece|invention|theory|creation|film|sculpture)\Z")
# The one kind of capitalised word a description may hold besides a title: "The English novelist Jane Austen" (not "The
# Amazon beats the Nile", "John Adams served under George Washington").
_NATIONALITY = re.compile(r"[A-Z][a-z]+(?:ish|ian|an|ese|ch|i)")
_POSSESSIVE = frozenset(("our", "its", "his", "her", "their", "my", "your"))  # a description of its own: "Our Sun"
_DETERMINERS = frozenset(("the", "a", "an", "its", "his", "her", "their", "our", "this", "that", "one"))
# A kind of place before "of" and the name: "the city of Canberra" (not "the capital city of Australia").
_PLACE_OF = frozenset(("city", "town", "village", "state", "province", "island", "isle", "kingdom", "republic",
                       "county", "port", "region", "country", "district"))
# A sentence's capitalised opening that is no name: "It's", "People", "Let", "However".
_NOT_A_NAME = frozenset(("i", "it", "its", "he", "she", "we", "you", "they", "there", "here", "this", "that", "these",
                         "those", "my", "our", "your", "his", "her", "their", "people", "many", "most", "some",
                         "everyone", "nobody", "one", "im", "ive", "id", "youll", "youre", "theyre", "well", "let",
                         "lets", "so", "now", "first", "then", "also", "however", "actually", "sure", "yes", "okay",
                         "ok", "hmm", "note", "according", "based", "given", "since", "because", "if", "while",
                         "although", "why", "can", "could", "would", "should", "will", "may", "might", "must"))
# What "Who wrote/painted ...?" is answered with besides a restatement: "Jane Austen is the author."
_WHO = re.compile(r"(?i)\Awho\b|\bwho\s+(?:was|is|were|are|wrote|painted|composed|discovered|invented|founded)\b")
_ROLE = re.compile(r"(?i)\A(?:the\s+)?(?:author|writer|novelist|poet|playwright|painter|artist|composer|inventor|"
                   r"discoverer|founder|creator|director|architect|sculptor|person)(?:\s+of\s+it)?[.!]?\Z")
# Said of no one thing: "..., but neither is the capital."
_NO_SUBJECT = frozenset(("neither", "none", "nobody", "no one", "nothing", "either", "both", "all", "each", "this",
                         "that", "it", "which", "they", "there", "here", "many", "some", "most"))
_PRONOUN = frozenset(("it", "this", "that", "them", "one", "the one"))  # "Leonardo da Vinci painted it."
# Where a name is, after it: "Mount Everest in the Himalayas" (compared without it; "Stoke on Trent" stays whole).
_WHERE_TAIL = re.compile(r"(?<=[A-Za-z])\s+(?:in|on|near)\s+(?:the\s+)?[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*){0,3}\s*$")
