# %% [markdown]
# # Beyond: speculation under load and under a grammar
#
# Lesson: `docs/beyond/specdec-serving.md`. `./notebook.sh specdec-serving` runs it on your own code, with the
# answer key for the modules it needs that you have not edited.

# %%
import torch

from g2c.specdec.serving.constrain import scale

# %%
# BEGIN SOLUTION
result = scale(torch.ones(2, 3), 2.0)
# END SOLUTION
result

# %% [markdown]
# **Question:** What does `scale` return for a (2, 3) tensor of ones and factor 2?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# A (2, 3) tensor of twos.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# Full marks: shape (2, 3) and every value 2.0.
# <!-- END RUBRIC -->
