# ruff: noqa: E501  (the passages are quoted whole, as the tool shows them)
"""The worked examples of VT-Search-v0: two train-split questions, searched and answered.

The outputs are what the default dense retriever returns for these queries
over the embedded corpus (``tests/domains/search`` checks it), and every
article they show is a train-split article: an example never shows a
held-out task's text. With ``corpus=`` or ``dataset=`` the env has no
examples unless given ``examples=`` (these are about the embedded corpus).
"""

from __future__ import annotations

from vt_envs.core.examples import ExampleCall, WorkedExample

__all__ = ["EXAMPLES"]

_WOLLSTONECRAFT = (
    "<information>Doc 1 (Title: Mary Wollstonecraft) Mary Wollstonecraft was an English writer and philosopher best known for her advocacy of women's rights. Until the late twentieth century, Wollstonecraft's life, which encompassed several unconventional personal relationships, received more attention than her writing. Wollstonecraft is regarded as one of the founding feminist philosophers, and feminists often cite both her life and her works as important influences.\n"
    "Doc 2 (Title: A Vindication of the Rights of Woman) A Vindication of the Rights of Woman: with Strictures on Political and Moral Subjects is a 1792 essay by British philosopher and women's rights advocate Mary Wollstonecraft. It is considered a feminist or, more precisely, proto-feminist piece, and one of the pioneering works in the tradition now known as feminist philosophy.\n"
    "Doc 3 (Title: Mary Shelley) Mary Wollstonecraft Shelley was an English novelist who wrote the Gothic novel Frankenstein; or, The Modern Prometheus (1818), which is considered an early example of science fiction. She also edited and promoted the works of her husband, the Romantic poet and philosopher Percy Bysshe Shelley. Her father was the political philosopher William Godwin and her mother was the philosopher and women's rights advocate Mary Wollstonecraft.</information>"
)
_DURKHEIM = (
    "<information>Doc 1 (Title: Émile Durkheim) David Émile Durkheim was a French sociologist. He formally established the academic discipline of sociology and is commonly cited as one of the principal architects of modern social science, along with Karl Marx and Max Weber.\n"
    "Doc 2 (Title: Carl Theodor Dreyer) Carl Theodor Dreyer, commonly known as Carl Th. Dreyer, was a Danish film director and screenwriter. Widely considered one of the greatest filmmakers in history, his movies are noted for emotional austerity and slow, stately pacing, frequent themes of social intolerance, the inseparability of fate and death, and the power of evil in earthly life.\n"
    "Doc 3 (Title: Alexandre Dumas) Alexandre Dumas, also known as Alexandre Dumas père, was a French novelist and playwright.</information>"
)
_MARX = (
    "<information>Doc 1 (Title: Karl Marx) Karl Marx was a German philosopher, social and political theorist, economist, and revolutionary socialist. He developed the theory of historical materialism, analyzing class struggle under capitalism and predicting the system's overthrow by the proletariat in favour of communism. Marx co-authored The Communist Manifesto (1848) with Friedrich Engels, and undertook a critique of classical political economy in his magnum opus, Das Kapital (1867–1894). Marx's ideas and their subsequent development, collectively known as Marxism, have had enormous influence and have influenced revolutions and uprisings in many countries.\n"
    "Doc 2 (Title: Friedrich Engels) Friedrich Engels was a German philosopher, social and political theorist, and revolutionary socialist. He is best known for his lifelong collaboration with Karl Marx, with whom he co-authored The Communist Manifesto (1848) and developed the political and philosophical system that came to be known as Marxism. After Marx's death, Engels served as the editor of his works, completing the second and third volumes of Das Kapital.\n"
    "Doc 3 (Title: Eduard Bernstein) Eduard Bernstein was a German social democratic politician and socialist theorist. A member of the Social Democratic Party (SPD), Bernstein is best known for his reformist challenge to Marxism known as evolutionary socialism or revisionism, in which he questioned the revolutionary predictions of Karl Marx and advocated for a gradual, parliamentary path to socialism. His political and theoretical work played a significant role in the development of social democracy and democratic socialism.</information>"
)

EXAMPLES = (
    WorkedExample(
        'Which subject is this passage about? Its name is replaced by ___.\n"A ___ of the ___ of ___: with Strictures on Political and Moral Subjects is a 1792 essay by British philosopher and women\'s ___ advocate Mary Wollstonecraft."\nAnswer with the name of the subject.',
        (ExampleCall("search", {"query": "1792 essay by Mary Wollstonecraft"}, _WOLLSTONECRAFT),),
        "A Vindication of the Rights of Woman",
    ),
    WorkedExample(
        'The Wikipedia summary of "Émile Durkheim" mentions a person in this sentence, with their name replaced by ___:\n"He formally established the academic discipline of sociology and is commonly cited as one of the principal architects of modern social science, along with ___ and Max Weber."\nWhat nationality is that person, according to their own Wikipedia summary? Answer with the nationality adjective (for example "French").',
        (
            ExampleCall("search", {"query": "Émile Durkheim"}, _DURKHEIM),
            ExampleCall("search", {"query": "Karl Marx"}, _MARX),
        ),
        "German",
    ),
)
"""A one-search masked-subject question (most tasks are of that kind) and a
two-search (bridge) question."""
