"""Written forms a voice must say in words: numbers, dates, times, currencies, units, URLs and symbols.

:func:`verbalize` rewrites complete text (whole words) for a TTS: every digit becomes words through
``num2words`` (Savoir-faire Linux's number-to-words library: cardinals, ordinals, years, currencies), and
what a person would not read character by character is said as a person says it:

* currencies ``$12.50`` → "twelve dollars and fifty cents", ``€5 million`` → "five million euros";
* dates ``2026-11-27`` / ``11/27/2026`` / ``November 27, 2026`` → "November twenty-seventh, twenty
  twenty-six";
* times ``10:30 am`` → "ten thirty a.m.", ``9:05`` → "nine oh five", ``3pm`` → "three p.m.";
* ``50%`` → "fifty percent", ``21°C`` → "twenty-one degrees Celsius", ``5 km`` → "five kilometers";
* ordinals ``3rd`` → "third", years after "in"/"since"/... (``in 1999`` → "nineteen ninety-nine"), ranges
  ``5-10`` → "five to ten", decimals ``3.14`` → "three point one four", ``-4`` → "minus four", digit runs
  longer than :data:`MAX_CARDINAL_DIGITS` digit by digit;
* URLs ``https://www.example.com/a`` → "example dot com", e-mail addresses ``a@b.org`` → "a at b dot org";
* symbols ``& + = @ #`` → "and", "plus", "equals", "at", "number"; other symbols and emoji are removed, a
  hyphen not between two letters becomes a comma (never a list dash).

What comes out holds only letters, combining marks, whitespace and :data:`SPEECH_PUNCTUATION`
(:func:`~omniduplex.pipeline.text.speakable.is_speakable` is the predicate).
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal

from num2words import num2words

SPEECH_PUNCTUATION = frozenset(".,!?;:'\"’‘“”…—-()")
"""Punctuation a TTS may see: it shapes prosody and is never read out."""
MAX_CARDINAL_DIGITS = 15
"""Longer digit runs (phone numbers, a small model's ``7981981981…``) are said digit by digit."""
CURRENCIES = {"$": "USD", "€": "EUR", "£": "GBP"}
"""Currency symbols num2words names (ISO 4217 codes); ``¥`` is said "yen" after the amount."""
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
)
YEAR_CUES = frozenset(("in", "since", "by", "from", "until", "till", "of", "year", "before", "after"))
"""Words after which a four-digit number (1100-2099) is a year ("in 1999" → "nineteen ninety-nine")."""
UNITS = {
    "km/h": "kilometers per hour", "mph": "miles per hour", "km": "kilometers", "kg": "kilograms",
    "cm": "centimeters", "mm": "millimeters", "ml": "milliliters", "mg": "milligrams", "lb": "pounds",
    "lbs": "pounds", "oz": "ounces", "ft": "feet", "mi": "miles", "kWh": "kilowatt hours", "kW": "kilowatts",
    "GB": "gigabytes", "MB": "megabytes", "KB": "kilobytes", "TB": "terabytes", "GHz": "gigahertz",
    "MHz": "megahertz", "Hz": "hertz", "hrs": "hours", "hr": "hours", "min": "minutes", "sec": "seconds",
    "ms": "milliseconds", "m": "meters", "g": "grams", "l": "liters", "h": "hours", "s": "seconds",
    "°C": "degrees Celsius", "°F": "degrees Fahrenheit", "°": "degrees",
}
"""Unit abbreviations after a number and their spoken plural; single letters only when glued (``5m``)."""
SYMBOLS = {"&": " and ", "+": " plus ", "=": " equals ", "@": " at ", "#": " number ", "%": " percent "}

_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_MONTH_RE = "|".join(m[:3] + (m[3:] and f"(?:{m[3:]}|\\.)?") for m in MONTHS)
_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"')\]]+", re.I)
_EMAIL = re.compile(r"\b([\w.+-]+)@([\w-]+(?:\.[\w-]+)+)\b")
_CURRENCY = re.compile(
    rf"([$€£¥])\s?({_NUM})(?:\s?(thousand|million|billion|trillion|[kKmMbB]n?)\b)?"
)
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_US_DATE = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b")
_MONTH_DAY = re.compile(rf"\b({_MONTH_RE})\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(\d{{4}})\b)?")
_DAY_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH_RE})\b(?:,?\s+(\d{{4}})\b)?")
_TIME = re.compile(r"\b(\d{1,2}):(\d{2})(?::\d{2})?(?:\s?([AaPp])\.?\s?[Mm]\.?(?![\w]))?")
_HOUR = re.compile(r"\b(\d{1,2})\s?([AaPp])\.?\s?[Mm]\b\.?")
_PERCENT = re.compile(rf"(-?)({_NUM})\s?%")
_UNIT = re.compile(
    rf"(-?)({_NUM})(?:\s?(km/h|mph|km|kg|cm|mm|ml|mg|lbs|lb|oz|ft|mi|kWh|kW|GB|MB|KB|TB|GHz|MHz|Hz|hrs|hr|min|"
    r"sec|ms|°\s?[CF]|°)|(m|g|l|h|s))(?![\w°])"
)
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.I)
_YEAR = re.compile(rf"\b((?:{'|'.join(sorted(YEAR_CUES))})\s+)(1[1-9]\d\d|20\d\d)\b(?![.,]\d)", re.I)
_DECADE = re.compile(r"\b(1[1-9]|20)(\d)0s\b")
_RANGE = re.compile(r"\b(\d{1,3})\s?[-–]\s?(\d{1,3})\b(?![-–.]\d)")
_NEGATIVE = re.compile(rf"(?<![\w.,])-({_NUM})")
_NUMBER = re.compile(_NUM)
_LONE_HYPHEN = re.compile(r"(?<![^\W\d_])[-–]+|[-–]+(?![^\W\d_])")
_SPACES = re.compile(r"[ \t]{2,}")


def _words(n: int) -> str:
    """``n`` in words without num2words' grouping commas ("one million two hundred and five")."""
    return num2words(n).replace(",", "")


def cardinal(text: str) -> str:
    """A written number (``1,234``, ``3.14``, ``007``) in words; digit runs longer than
    :data:`MAX_CARDINAL_DIGITS` digit by digit."""
    whole, _, frac = text.replace(",", "").partition(".")
    long = len(whole) > MAX_CARDINAL_DIGITS
    said = " ".join(_words(int(d)) for d in whole) if long else _words(int(whole))
    if frac:
        said += " point " + " ".join(_words(int(d)) for d in frac)
    return said


def _currency(m: re.Match) -> str:
    symbol, amount, scale = m.group(1), m.group(2).replace(",", ""), m.group(3)
    if scale:
        word = {"k": "thousand", "m": "million", "b": "billion", "bn": "billion"}.get(scale.lower(), scale)
        name = {"$": "dollars", "€": "euros", "£": "pounds", "¥": "yen"}[symbol]
        return f" {cardinal(amount)} {word} {name} "
    if symbol == "¥":
        return f" {cardinal(amount)} yen "
    said = num2words(Decimal(amount), to="currency", currency=CURRENCIES[symbol], separator=" and")
    said = re.sub(r"\s+and zero \w+$", "", said).replace(",", "")
    return f" {said} "


def _date(year: str | None, month: int, day: int) -> str:
    if not 1 <= month <= 12 or not 1 <= day <= 31:
        return " ".join(cardinal(x) for x in (str(month), str(day), year or "") if x)
    said = f"{MONTHS[month - 1]} {num2words(day, to='ordinal')}"
    return f"{said}, {num2words(int(year), to='year')}" if year else said


def _month_index(name: str) -> int:
    return [m[:3].lower() for m in MONTHS].index(name[:3].lower()) + 1


def _time(m: re.Match) -> str:
    hour, minute, half = int(m.group(1)), int(m.group(2)), m.group(3)
    if hour > 24 or minute > 59:
        return f" {cardinal(m.group(1))} {cardinal(m.group(2))} "
    said = _words(hour)
    if minute == 0:
        said += "" if half else " o'clock" if hour <= 12 else " hundred"
    else:
        said += (" oh " if minute < 10 else " ") + _words(minute)
    return f" {said}{f' {half.lower()}.m.' if half else ''} "


def _unit(m: re.Match) -> str:
    sign, number, unit = m.group(1), m.group(2), (m.group(3) or m.group(4)).replace(" ", "")
    name = UNITS.get(unit) or UNITS.get(unit.lower(), unit)
    if number in ("1", "1.0") and name.endswith("s") and not name.startswith("degrees"):
        name = {"feet": "foot", "kilometers per hour": "kilometer per hour"}.get(name, name[:-1])
    return f" {'minus ' if sign else ''}{cardinal(number)} {name} "


def _decade(m: re.Match) -> str:
    said = num2words(int(m.group(1) + m.group(2) + "0"), to="year")
    return f" {said[:-1]}ies " if said.endswith("y") else f" {said}s "


def _url(m: re.Match) -> str:
    host = re.sub(r"^(?:https?://)?(?:www\.)?", "", m.group(0), flags=re.I).split("/")[0].split(":")[0]
    return " " + " dot ".join(p for p in host.split(".") if p) + " "


def _keep(c: str) -> str:
    if c.isalpha() or c.isspace() or c in SPEECH_PUNCTUATION or unicodedata.category(c).startswith("M"):
        return c
    if c.isdigit():  # a digit of another script (Arabic-Indic, ...): its value in words
        return f" {_words(unicodedata.digit(c, 0))} "
    return " " if unicodedata.category(c)[0] in "PSZ" and ord(c) < 0x2190 else ""


def verbalize(text: str) -> str:
    """``text`` (complete words) with every written form above said in words; the result holds only letters,
    combining marks, whitespace and :data:`SPEECH_PUNCTUATION`.

    >>> verbalize("Order 4217 ships on 2026-11-28 at 10:30 am for $12.50.")
    'Order four thousand two hundred and seventeen ships on November twenty-eighth, twenty twenty-six at ten thirty a.m. for twelve dollars and fifty cents.'
    """  # noqa: E501
    if not any(c.isdigit() or c == "-" or not (c.isalpha() or c.isspace() or c in SPEECH_PUNCTUATION)
               for c in text):
        return text  # plain words: nothing to do (the common case)
    t = _URL.sub(_url, text)
    t = _EMAIL.sub(lambda m: f" {m.group(1)} at {m.group(2).replace('.', ' dot ')} ", t)
    t = _CURRENCY.sub(_currency, t)
    t = _ISO_DATE.sub(lambda m: _date(m.group(1), int(m.group(2)), int(m.group(3))), t)
    t = _US_DATE.sub(lambda m: _date(m.group(3), int(m.group(1)), int(m.group(2))), t)
    t = _MONTH_DAY.sub(lambda m: _date(m.group(3), _month_index(m.group(1)), int(m.group(2))), t)
    t = _DAY_MONTH.sub(lambda m: _date(m.group(3), _month_index(m.group(2)), int(m.group(1))), t)
    t = _TIME.sub(_time, t)
    t = _HOUR.sub(lambda m: f" {_words(int(m.group(1)))} {m.group(2).lower()}.m. ", t)
    t = _PERCENT.sub(lambda m: f" {'minus ' if m.group(1) else ''}{cardinal(m.group(2))} percent ", t)
    t = _DECADE.sub(_decade, t)
    t = _UNIT.sub(_unit, t)
    t = _ORDINAL.sub(lambda m: f" {num2words(int(m.group(1)), to='ordinal')} ", t)
    t = _YEAR.sub(lambda m: f"{m.group(1)}{num2words(int(m.group(2)), to='year')}", t)
    t = _RANGE.sub(lambda m: f" {cardinal(m.group(1))} to {cardinal(m.group(2))} ", t)
    t = _NEGATIVE.sub(lambda m: f" minus {cardinal(m.group(1))} ", t)
    t = _NUMBER.sub(lambda m: f" {cardinal(m.group(0))} ", t)
    t = "".join(SYMBOLS.get(c) or _keep(c) for c in t)
    t = _LONE_HYPHEN.sub(",", t)
    t = re.sub(r"(?:\s*,)+(\s*[.!?;:])", r"\1", t)  # no comma before a sentence mark
    t = _SPACES.sub(" ", re.sub(r"\s+([.,!?;:])", r"\1", t))
    if not text[:1].isspace():  # the padding of a replaced form at the text's edges
        t = t.lstrip(" ")
    return t if text[-1:].isspace() else t.rstrip(" ")
