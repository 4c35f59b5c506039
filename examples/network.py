"""The manual's network (Example 2 and 3 import it)."""

import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()  # noqa: UP008 - as in the manual
        self.fc = nn.Linear(1, 3)

    def forward(self, x):
        x = self.fc(x)
        x = F.relu(x)
        return x
