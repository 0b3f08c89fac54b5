"""A built-in vocabulary, so the simulator emits readable text without weights.

Token ids: 0 is end-of-sequence; ids from FIRST_WORD_ID map onto the word
list (cyclically, so any id below the vocab size decodes to something).
"""

from __future__ import annotations

import random

EOS_TOKEN_ID = 0
FIRST_WORD_ID = 16

_WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there one all we their has been would when more will who
if no out so said what up its about into than them can only other new some could time these
two may then do first any my now such like our over man me even most made after also did
many before must through back years where much your way well down should because each just
those people how too little state good very make world still own see men work long here get
both between life being under never day same another know while last might us great old year
off come since against go came right used take three states himself few house use during
without again place around however home small found thought went say part once general high
upon school every does got united left number course war until always away something fact
though water less public put think almost hand enough far took head yet government system
better set told nothing night end why called eyes find going look asked later point knew
city next program business give group toward young days let room president side social given
present several order national possible rather second face per among form important often
things looked early white case john become large big need four within felt along children
saw best church ever least power development light thought model token engine memory cache
queue tenant request stream latency throughput batch prefill decode kernel tensor shard
replica fair share quota bucket weight counter budget signal window schedule serve gateway
cluster
""".split()  # noqa: SIM905 - a word list reads better as text
_PUNCT = [".", ",", ";", ":", "!", "?", "\n"]

PIECES: list[str] = [" " + w for w in _WORDS] + _PUNCT
PUNCT_IDS = range(FIRST_WORD_ID + len(_WORDS), FIRST_WORD_ID + len(PIECES))


def piece(token_id: int) -> str:
    if token_id == EOS_TOKEN_ID:
        return ""
    if token_id < FIRST_WORD_ID:
        return f"<|special_{token_id}|>"
    return PIECES[(token_id - FIRST_WORD_ID) % len(PIECES)]


def sample_token(rng: random.Random) -> int:
    """A word most of the time, punctuation now and then."""
    if rng.random() < 0.1:
        return rng.choice(PUNCT_IDS)
    return FIRST_WORD_ID + rng.randrange(len(_WORDS))
